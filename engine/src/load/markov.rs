//! The Markov chain of pages with the RUBBoS pseudo-states BACK and END.
//!
//! Orientation: rows are the "from" state. Drawing walks the row's targets in order, accumulating
//! probabilities; when the uniform draw is beyond the row's sum the slack is an implicit self-loop
//! (as in the original emulator).
//!
//! History (RUBBoS `TransitionTable.nextState`): after moving to a state whose own BACK probability
//! is 0 the stack is cleared; otherwise the state just left is pushed. BACK pops; BACK with an
//! empty stack restarts the session at the start page.

use rand::Rng;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    Page(usize),
    Back,
    End,
}

#[derive(Clone, Debug)]
pub struct Row {
    /// (target, cumulative probability)
    cum: Vec<(Target, f64)>,
    pub back_prob: f64,
    #[allow(dead_code)] // read by stationary_without_back, which only the tests call
    pub sum: f64,
}

impl Row {
    pub fn new(targets: Vec<(Target, f64)>) -> Row {
        let mut acc = 0.0;
        let mut back_prob = 0.0;
        let cum = targets
            .into_iter()
            .map(|(t, p)| {
                if t == Target::Back {
                    back_prob += p;
                }
                acc += p;
                (t, acc)
            })
            .collect();
        Row { cum, back_prob, sum: acc }
    }
    #[allow(dead_code)] // the chain's own query, for tests and debugging; the walker does not need it
    /// The outgoing probability to `t` (without the implicit self-loop).
    pub fn prob(&self, t: Target) -> f64 {
        let mut prev = 0.0;
        let mut p = 0.0;
        for &(x, c) in &self.cum {
            if x == t {
                p += c - prev;
            }
            prev = c;
        }
        p
    }
}

#[derive(Clone, Debug)]
pub struct Chain {
    pub rows: Vec<Row>,
}

impl Chain {
    pub fn new(rows: Vec<Row>) -> Chain {
        Chain { rows }
    }
    /// Draw the next target from state `from` (slack = stay at `from`).
    #[inline]
    pub fn draw<R: Rng>(&self, from: usize, rng: &mut R) -> Target {
        let u: f64 = rng.gen();
        for &(t, c) in &self.rows[from].cum {
            if u < c {
                return t;
            }
        }
        Target::Page(from)
    }
}

/// What the walker does next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Move<U> {
    /// request a page (a new state; its URL still has to be rendered)
    Go(usize),
    /// BACK: re-request a page from history with the URL it had
    Back(usize, U),
    /// END of session
    End,
    /// BACK with an empty stack: restart the session at the start page
    Restart,
}

/// A session's position in the chain and its history stack (of states with their URLs).
#[derive(Debug)]
pub struct Walker<U> {
    pub current: usize,
    pub history: Vec<(usize, U)>,
}

/// History stacks are capped (the original uses a fixed array); the oldest entries are dropped.
pub const HISTORY_CAP: usize = 256;

impl<U: Clone> Walker<U> {
    pub fn new(start: usize) -> Walker<U> {
        Walker { current: start, history: Vec::new() }
    }
    pub fn restart(&mut self, start: usize) {
        self.current = start;
        self.history.clear();
    }
    /// Draw the next move (`force_back` = the last response asked for BACK, e.g. "Sorry").
    pub fn draw<R: Rng>(&self, chain: &Chain, force_back: bool, rng: &mut R) -> Target {
        if force_back {
            Target::Back
        } else {
            chain.draw(self.current, rng)
        }
    }
    /// Apply a drawn target; `current_url` is the URL of the page being left.
    pub fn apply(&mut self, chain: &Chain, t: Target, current_url: &U) -> Move<U> {
        match t {
            Target::End => Move::End,
            Target::Back => match self.history.pop() {
                Some((s, url)) => {
                    self.current = s;
                    Move::Back(s, url)
                }
                None => Move::Restart,
            },
            Target::Page(j) => {
                if chain.rows[j].back_prob == 0.0 {
                    self.history.clear();
                } else {
                    if self.history.len() >= HISTORY_CAP {
                        self.history.remove(0);
                    }
                    self.history.push((self.current, current_url.clone()));
                }
                self.current = j;
                Move::Go(j)
            }
        }
    }
}

/// Stationary page mix of the chain where END (and BACK, approximately) restart at `start`:
/// used by tests and `--dry-run` reports. BACK is treated as END here, so only exact for
/// tables without BACK.
#[allow(dead_code)] // only the tests call it
pub fn stationary_without_back(chain: &Chain, start: usize) -> Vec<f64> {
    let n = chain.rows.len();
    let mut p = vec![vec![0.0; n]; n];
    for (i, row) in chain.rows.iter().enumerate() {
        let mut prev = 0.0;
        for &(t, c) in &row.cum {
            let q = c - prev;
            prev = c;
            match t {
                Target::Page(j) => p[i][j] += q,
                Target::Back | Target::End => p[i][start] += q,
            }
        }
        p[i][i] += (1.0 - row.sum).max(0.0);
    }
    let mut pi = vec![1.0 / n as f64; n];
    for _ in 0..20_000 {
        let mut next = vec![0.0; n];
        for i in 0..n {
            for j in 0..n {
                next[j] += pi[i] * p[i][j];
            }
        }
        // lazy chain step to avoid periodicity
        let diff: f64 = next.iter().zip(&pi).map(|(a, b)| (a - b).abs()).sum();
        for j in 0..n {
            pi[j] = 0.5 * pi[j] + 0.5 * next[j];
        }
        if diff < 1e-13 {
            break;
        }
    }
    pi
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::SmallRng;
    use rand::SeedableRng;

    fn chain(rows: Vec<Vec<(Target, f64)>>) -> Chain {
        Chain::new(rows.into_iter().map(Row::new).collect())
    }

    /// A 4-page table (no BACK) whose stationary mix is computed by arithmetic, vs a long walk,
    /// thinned to every 20th step so that the draws are nearly independent: chi-square test.
    #[test]
    fn stationary_mix_matches_table_chi_square() {
        use Target::*;
        let c = chain(vec![
            vec![(Page(1), 0.6), (Page(2), 0.3), (End, 0.1)],
            vec![(Page(0), 0.2), (Page(2), 0.3), (Page(3), 0.4)], // slack 0.1 = self-loop
            vec![(Page(1), 0.5), (Page(3), 0.3), (End, 0.2)],
            vec![(Page(0), 0.7), (Page(3), 0.2), (End, 0.1)],
        ]);
        let pi = stationary_without_back(&c, 0);
        // check pi against the balance equations by hand: pi P = pi
        let mut rng = SmallRng::seed_from_u64(7);
        let mut w: Walker<()> = Walker::new(0);
        let mut counts = [0u64; 4];
        let thin = 20;
        let samples = 40_000;
        for step in 0..samples * thin {
            let t = w.draw(&c, false, &mut rng);
            match w.apply(&c, t, &()) {
                Move::End | Move::Restart => w.restart(0),
                _ => {}
            }
            if step % thin == 0 {
                counts[w.current] += 1;
            }
        }
        let chi2: f64 = (0..4)
            .map(|i| {
                let e = pi[i] * samples as f64;
                (counts[i] as f64 - e).powi(2) / e
            })
            .sum();
        // 3 degrees of freedom: P(chi2 > 16.27) = 0.001
        assert!(chi2 < 16.27, "chi2 = {chi2}, counts {counts:?}, expected mix {pi:?}");
        // and the mix is not uniform (the test could fail on a wrong sampler)
        assert!((pi[1] - 0.25).abs() > 0.02);
    }

    /// BACK pops the history; states whose own BACK probability is 0 clear the stack;
    /// BACK with an empty stack restarts; END ends.
    #[test]
    fn back_and_end_semantics() {
        use Target::*;
        // 0 (home, no BACK) -> 1 (list, has BACK) -> 2 (item, has BACK)
        let c = chain(vec![vec![(Page(1), 1.0)], vec![(Page(2), 0.5), (Back, 0.5)], vec![(Back, 0.5), (End, 0.5)]]);
        let mut w: Walker<&str> = Walker::new(0);
        assert_eq!(w.apply(&c, Page(1), &"/home"), Move::Go(1));
        assert_eq!(w.history, vec![(0, "/home")]);
        assert_eq!(w.apply(&c, Page(2), &"/list?p=1"), Move::Go(2));
        assert_eq!(w.history.len(), 2);
        assert_eq!(w.apply(&c, Back, &"/item?i=9"), Move::Back(1, "/list?p=1"));
        assert_eq!(w.current, 1);
        assert_eq!(w.apply(&c, Back, &"/list?p=1"), Move::Back(0, "/home"));
        assert_eq!(w.apply(&c, Back, &"/home"), Move::Restart);
        // moving to a state without BACK clears the stack
        let mut w: Walker<&str> = Walker::new(1);
        w.apply(&c, Page(2), &"a");
        w.apply(&c, Page(1), &"b");
        assert_eq!(w.history.len(), 2);
        w.apply(&c, Page(0), &"c");
        assert!(w.history.is_empty());
        assert_eq!(w.apply(&c, End, &"x"), Move::End);
    }

    #[test]
    fn slack_is_a_self_loop() {
        let c = chain(vec![vec![(Target::Page(1), 0.25)], vec![(Target::Page(0), 1.0)]]);
        let mut rng = SmallRng::seed_from_u64(3);
        let n = 100_000;
        let stay = (0..n).filter(|_| c.draw(0, &mut rng) == Target::Page(0)).count() as f64 / n as f64;
        // binomial sd = sqrt(.75*.25/n) = 0.00137
        assert!((stay - 0.75).abs() < 0.006, "stay {stay}");
    }
}
