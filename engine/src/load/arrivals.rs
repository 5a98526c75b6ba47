//! Open-loop arrivals: Poisson at rate λ, or a two-state Markov-modulated Poisson process (MMPP)
//! with a given index of dispersion I (Mi, Casale, Cherkasova, Smirni 2009).
//!
//! Parameterisation: the two states have rates λ(1+c) ("surge") and λ(1-c) ("calm") with the
//! same switching rate r in both directions, so each holds half of the time and the mean rate is
//! λ. For a 2-state MMPP the asymptotic index of dispersion of counts is
//!   I = 1 + 2 r1 r2 (λ1-λ2)^2 / ((r1+r2)^2 (λ1 r2 + λ2 r1)),
//! which here is I = 1 + c^2 λ / r, hence r = c^2 λ / (I - 1): a larger I means longer surges.
//! Over a window of length t the index of dispersion of counts is
//!   IDC(t) = 1 + (I-1) (1 - (1 - e^{-2rt}) / (2rt)).

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

#[inline]
fn exp<R: Rng>(rate: f64, rng: &mut R) -> f64 {
    -(1.0 - rng.gen::<f64>()).ln() / rate
}

/// The modulating two-state chain, advanced lazily in time.
pub struct Modulator {
    pub switch_rate: f64,
    pub contrast: f64,
    surge: bool,
    pub(crate) next_switch: f64,
    rng: SmallRng,
}

impl Modulator {
    pub fn new(rate: f64, dispersion: f64, contrast: f64, seed: u64) -> Modulator {
        let switch_rate = contrast * contrast * rate / (dispersion - 1.0);
        let mut rng = SmallRng::seed_from_u64(seed ^ 0x6d6d_7070);
        let surge = rng.gen::<bool>();
        let next_switch = exp(switch_rate, &mut rng);
        Modulator { switch_rate, contrast, surge, next_switch, rng }
    }
    /// Rate factor (1+c or 1-c) at time t (t must not decrease between calls).
    #[inline]
    pub fn factor_at(&mut self, t: f64) -> f64 {
        while t >= self.next_switch {
            self.surge = !self.surge;
            self.next_switch += exp(self.switch_rate, &mut self.rng);
        }
        if self.surge {
            1.0 + self.contrast
        } else {
            1.0 - self.contrast
        }
    }
}

#[allow(dead_code)] // used by tests and documentation
/// Expected index of dispersion of counts over windows of `t` seconds (see module docs).
pub fn idc_at(rate: f64, dispersion: f64, contrast: f64, t: f64) -> f64 {
    if dispersion <= 1.0 {
        return 1.0;
    }
    let r = contrast * contrast * rate / (dispersion - 1.0);
    let x = 2.0 * r * t;
    1.0 + (dispersion - 1.0) * (1.0 - (1.0 - (-x).exp()) / x)
}

/// Arrival instants (seconds from the start), one after the other.
pub struct Arrivals {
    rate: f64,
    contrast: f64,
    switch_rate: f64,
    surge: bool,
    t: f64,
    rng: SmallRng,
}

impl Arrivals {
    pub fn new(rate: f64, dispersion: f64, contrast: f64, seed: u64) -> Arrivals {
        let mut rng = SmallRng::seed_from_u64(seed ^ 0x6172_7269);
        let modulated = dispersion > 1.0 && contrast > 0.0;
        let switch_rate = if modulated { contrast * contrast * rate / (dispersion - 1.0) } else { 0.0 };
        let surge = rng.gen::<bool>();
        Arrivals { rate, contrast: if modulated { contrast } else { 0.0 }, switch_rate, surge, t: 0.0, rng }
    }
    /// The next arrival instant (s).
    #[inline]
    pub fn next(&mut self) -> f64 {
        if self.rate <= 0.0 {
            return f64::INFINITY;
        }
        loop {
            let lam = self.rate * if self.surge { 1.0 + self.contrast } else { 1.0 - self.contrast };
            let total = lam + self.switch_rate;
            self.t += exp(total, &mut self.rng);
            if self.switch_rate == 0.0 || self.rng.gen::<f64>() * total < lam {
                return self.t;
            }
            self.surge = !self.surge;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(rate: f64, i: f64, window: f64, windows: usize) -> Vec<f64> {
        let mut a = Arrivals::new(rate, i, 0.8, 42);
        let mut c = vec![0.0; windows];
        loop {
            let t = a.next();
            let k = (t / window) as usize;
            if k >= windows {
                break;
            }
            c[k] += 1.0;
        }
        c
    }

    fn mean_var(c: &[f64]) -> (f64, f64) {
        let m = c.iter().sum::<f64>() / c.len() as f64;
        let v = c.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (c.len() - 1) as f64;
        (m, v)
    }

    #[test]
    fn poisson_rate_and_dispersion_one() {
        let c = counts(500.0, 1.0, 0.1, 20_000);
        let (m, v) = mean_var(&c);
        assert!((m - 50.0).abs() < 0.3, "mean count {m}"); // sd of mean = sqrt(50/20000) = 0.05
        let idc = v / m;
        assert!((idc - 1.0).abs() < 0.06, "idc {idc}"); // sd ~ sqrt(2/20000) = 0.01
    }

    #[test]
    fn mmpp_index_of_dispersion_matches() {
        // rate 1000/s, I = 10; windows of 1 s: IDC(1) = 1 + 9 (1 - (1-e^-142)/142) = 9.94
        let (rate, i, w) = (1000.0, 10.0, 1.0);
        let c = counts(rate, i, w, 3000);
        let (m, v) = mean_var(&c);
        assert!((m / rate - 1.0).abs() < 0.03, "mean count {m}");
        let expect = idc_at(rate, i, 0.8, w);
        let idc = v / m;
        assert!((idc / expect - 1.0).abs() < 0.15, "idc {idc} expected {expect}");
        // and clearly not Poisson
        assert!(idc > 5.0);
    }
}
