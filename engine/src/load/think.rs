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

/// The mean of `truncated_exp(mean)`: E[min(X, 10 m)] = m (1 - e^-10).
#[allow(dead_code)]
pub fn truncated_mean(mean: f64) -> f64 {
    mean * (1.0 - (-10.0f64).exp())
}

/// Think-time sampler shared by all users: in closed loop with dispersion I > 1 a global
/// two-state chain switches the think-time mean between m/(1+c) ("surge") and m/(1-c) ("calm"),
/// so that the users' request rate follows a 2-state MMPP (Mi et al. 2009). With equal time in
/// both states and draws made in proportion to the rate, the mean over all draws stays m.
pub struct Think {
    pub modulator: Option<Modulator>,
}

impl Think {
    /// `nominal_rate` = users / mean think time (requests per second the population makes).
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
    fn modulated_think_keeps_its_mean() {
        // 1000 users at mean 1 s, I = 20: the mean over draws made at the users' rate stays 1 s
        let mut think = Think::new(20.0, 0.8, 1000.0, 5);
        let mut rng = SmallRng::seed_from_u64(5);
        let (mut t, mut sum, mut n) = (0.0, 0.0, 0u64);
        // draws happen at the population's current rate 1000 * f: Bernoulli thinning on a
        // 0.1 ms grid (exact in the limit; the modulating periods last ~30 ms)
        let dt = 1e-4;
        while t < 300.0 {
            let f = think.modulator.as_mut().unwrap().factor_at(t);
            if rng.gen::<f64>() < 1000.0 * f * dt {
                sum += think.draw(1.0, t, &mut rng);
                n += 1;
            }
            t += dt;
        }
        let m = sum / n as f64;
        assert!((m - 1.0).abs() < 0.05, "mean {m} over {n} draws");
    }
}
