//! Think times: negative-exponential, truncated (clamped) at 10x the mean as in TPC-W clause
//! 5.3.2.1; optionally modulated by a two-state Markov chain to make closed-loop load bursty.

use rand::Rng;

use super::arrivals::Modulator;

/// One think time in seconds: -mean * ln(U), values beyond 10 x mean become 10 x mean.
#[inline]
pub fn truncated_exp<R: Rng>(mean: f64, rng: &mut R) -> f64 {
    if mean <= 0.0 {
        return 0.0;
    }
    let u: f64 = 1.0 - rng.gen::<f64>(); // (0, 1]
    let x = -mean * u.ln();
    x.min(10.0 * mean)
}

/// A negative-exponential draw with mean `mean`, values beyond `cap` become `cap` (TPC-W's user
/// session minimum duration: mean 15 min, cap 60 min, clause 6.1.9.2).
#[inline]
pub fn truncated_exp_at<R: Rng>(mean: f64, cap: f64, rng: &mut R) -> f64 {
    if mean <= 0.0 {
        return 0.0;
    }
    let u: f64 = 1.0 - rng.gen::<f64>(); // (0, 1]
    (-mean * u.ln()).min(cap)
}

/// The mean of `truncated_exp(mean)`: E[min(X, 10 m)] = m (1 - e^-10).
#[allow(dead_code)] // only the tests call it
pub fn truncated_mean(mean: f64) -> f64 {
    mean * (1.0 - (-10.0f64).exp())
}

/// Think-time sampler shared by all users: in closed loop with dispersion I > 1 a global
/// two-state chain switches the think-time mean between m/(1+c) ("surge") and m/(1-c) ("calm"):
/// each user's requests follow a 2-state MMPP with mean rate 1/m and index of dispersion I
/// (Mi et al. 2009), and since the state is shared the users surge together. The switching rate
/// is r = c^2 (1/m) / (I - 1), so surges last about (I - 1) m / c^2: long against the think
/// time, which the closed loop needs to follow them. With equal time in both states and draws
/// made in proportion to the rate, the mean over all draws stays m.
pub struct Think {
    pub modulator: Option<Modulator>,
}

impl Think {
    /// `nominal_rate` = 1 / mean think time (the rate of one user's requests).
    pub fn new(dispersion: f64, contrast: f64, nominal_rate: f64, seed: u64) -> Think {
        let modulator = if dispersion > 1.0 && contrast > 0.0 && nominal_rate > 0.0 {
            Some(Modulator::new(nominal_rate, dispersion, contrast, seed))
        } else {
            None
        };
        Think { modulator }
    }
    /// Draw a think time (s) for a page whose mean is `mean`, at time `t` (s since run start).
    #[inline]
    pub fn draw<R: Rng>(&mut self, mean: f64, t: f64, rng: &mut R) -> f64 {
        let m = match &mut self.modulator {
            None => mean,
            Some(md) => mean / md.factor_at(t),
        };
        truncated_exp(m, rng)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::SmallRng;
    use rand::SeedableRng;

    #[test]
    fn think_mean_and_truncation() {
        let mut rng = SmallRng::seed_from_u64(11);
        let n = 1_000_000;
        let mean = 7.0;
        let mut sum = 0.0;
        let mut max: f64 = 0.0;
        let mut at_cap = 0;
        for _ in 0..n {
            let x = truncated_exp(mean, &mut rng);
            sum += x;
            max = max.max(x);
            if x == 70.0 {
                at_cap += 1;
            }
        }
        let m = sum / n as f64;
        // sd of the mean ~ 7/sqrt(n) = 0.007: 4 sd
        assert!((m - truncated_mean(mean)).abs() < 0.028, "mean {m}");
        assert!(max <= 70.0);
        // P(X > 70) = e^-10 = 4.54e-5 -> about 45 of 1e6 at the cap
        assert!((15..=90).contains(&at_cap), "at cap {at_cap}");
    }

    #[test]
    fn session_minimum_duration_mean_and_cap() {
        // TPC-W USMD: mean 15 min, capped at 60 min; E[min(X, 4m)] = m (1 - e^-4)
        let mut rng = SmallRng::seed_from_u64(12);
        let n = 400_000;
        let (m, cap) = (900.0, 3600.0);
        let mut sum = 0.0;
        let mut at_cap = 0;
        for _ in 0..n {
            let x = truncated_exp_at(m, cap, &mut rng);
            assert!(x <= cap);
            sum += x;
            at_cap += (x == cap) as u32;
        }
        let mean = sum / n as f64;
        let want = m * (1.0 - (-4.0f64).exp());
        // sd of the mean ~ 900 / sqrt(n) = 1.4 s: 4 sd
        assert!((mean - want).abs() < 6.0, "mean {mean} vs {want}");
        // P(X > 4m) = e^-4 = 1.83 %
        let p = at_cap as f64 / n as f64;
        assert!((p - 0.0183).abs() < 0.0015, "at cap {p}");
    }

    /// Closed loop, zero response time: N users each think then "request". With I = 1 the
    /// aggregate request counts are Poisson-like (index of dispersion ~ 1); with I = 10 (surges
    /// of ~14 s) the shared chain swings the rate between ~1.8x and ~0.2x: very bursty.
    fn closed_loop_idc(dispersion: f64) -> f64 {
        use std::cmp::Reverse;
        use std::collections::BinaryHeap;
        let (users, mean, window, horizon) = (2000u32, 1.0, 0.5, 600.0);
        let mut think = Think::new(dispersion, 0.8, 1.0 / mean, 9);
        let mut rng = SmallRng::seed_from_u64(9);
        let mut heap: BinaryHeap<Reverse<(u64, u32)>> = (0..users).map(|u| Reverse(((rng.gen::<f64>() * 1e9) as u64, u))).collect();
        let mut counts = vec![0f64; (horizon / window) as usize];
        while let Some(Reverse((t_ns, u))) = heap.pop() {
            let t = t_ns as f64 / 1e9;
            if t >= horizon {
                break;
            }
            if t >= 10.0 {
                counts[(t / window) as usize] += 1.0;
            }
            let z = think.draw(mean, t, &mut rng);
            heap.push(Reverse((((t + z) * 1e9) as u64, u)));
        }
        let c = &counts[(10.0 / window) as usize..];
        let m = c.iter().sum::<f64>() / c.len() as f64;
        let v = c.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (c.len() - 1) as f64;
        v / m
    }

    #[test]
    fn bursty_think_makes_closed_loop_bursty() {
        let plain = closed_loop_idc(1.0);
        let bursty = closed_loop_idc(10.0);
        eprintln!("closed-loop index of dispersion: plain {plain:.2}, bursty {bursty:.2}");
        // a closed loop of 2000 users with exponential think is close to Poisson
        assert!((0.7..1.3).contains(&plain), "plain idc {plain}");
        assert!(bursty > 50.0, "bursty idc {bursty} (plain {plain})");
    }

    #[test]
    fn modulated_think_keeps_its_mean() {
        // mean 1 s, I = 2: surges of ~1.6 s; draws made at the population's rate 100 x f,
        // simulated exactly (exponential steps restarted at each switch of the chain)
        let mut think = Think::new(2.0, 0.8, 1.0, 5);
        let mut rng = SmallRng::seed_from_u64(5);
        let (mut t, mut sum, mut n) = (0.0, 0.0, 0u64);
        while t < 20_000.0 {
            let md = think.modulator.as_mut().unwrap();
            let f = md.factor_at(t);
            let step = -(1.0 - rng.gen::<f64>()).ln() / (100.0 * f);
            if t + step >= md.next_switch {
                t = md.next_switch; // memoryless: restart the step in the new state
                continue;
            }
            t += step;
            sum += think.draw(1.0, t, &mut rng);
            n += 1;
        }
        let m = sum / n as f64;
        // ~12,000 surges: the share of time in each state is within ~0.6 %, the mean within ~1 %
        assert!((m - 1.0).abs() < 0.04, "mean {m} over {n} draws");
    }
}
