//! YCSB's key choosers, re-implemented from the algorithms of its `generator` package:
//!
//! * [`Zipfian`] — Gray et al.'s "Quickly generating billion-record synthetic databases"
//!   method, as YCSB's `ZipfianGenerator`: item 0 is the most popular, P(0) = 1/ζ(n, θ) and
//!   P(1) = 2^-θ/ζ(n, θ) exactly, the rest approximated by a power law. ζ is updated
//!   incrementally when the item count grows (the `latest` chooser).
//! * [`ScrambledZipfian`] — a Zipf(θ = 0.99) draw over 10^10 items (ζ precomputed as YCSB does),
//!   hashed with FNV-1a 64 onto the key range, so the popular keys are scattered over it.
//! * `latest` — the newest key minus a Zipf draw over the keys inserted so far.

use rand::Rng;

/// YCSB's Zipf constant θ.
pub const ZIPFIAN_CONSTANT: f64 = 0.99;
/// The item space of the scrambled Zipf draw.
pub const SCRAMBLED_ITEMS: u64 = 10_000_000_000;
/// ζ(10^10, 0.99), as YCSB hard-codes it.
pub const SCRAMBLED_ZETAN: f64 = 26.46902820178302;

const FNV_OFFSET_BASIS_64: u64 = 0xCBF2_9CE4_8422_2325;
const FNV_PRIME_64: u64 = 1_099_511_628_211;

/// YCSB's `Utils.fnvhash64`: FNV-1a over the 8 little-end bytes of `val`, as a non-negative
/// Java long (`Math.abs`).
pub fn fnv64(val: i64) -> i64 {
    let mut v = val;
    let mut h = FNV_OFFSET_BASIS_64;
    for _ in 0..8 {
        let octet = (v & 0xff) as u64;
        v >>= 8;
        h ^= octet;
        h = h.wrapping_mul(FNV_PRIME_64);
    }
    (h as i64).wrapping_abs()
}

/// ζ(n, θ) = Σ_{i=1..n} 1/i^θ, continued from ζ(start, θ) = `initial`.
pub fn zeta(start: u64, n: u64, theta: f64, initial: f64) -> f64 {
    let mut sum = initial;
    for i in start..n {
        sum += 1.0 / ((i + 1) as f64).powf(theta);
    }
    sum
}

/// A Zipf draw over `items` items starting at `base` (item `base` most popular).
#[derive(Clone, Debug)]
pub struct Zipfian {
    pub base: u64,
    pub items: u64,
    theta: f64,
    alpha: f64,
    zeta2theta: f64,
    zetan: f64,
    eta: f64,
    count_for_zeta: u64,
}

impl Zipfian {
    pub fn new(base: u64, items: u64, theta: f64) -> Zipfian {
        let zetan = zeta(0, items, theta, 0.0);
        Zipfian::with_zetan(base, items, theta, zetan)
    }

    pub fn with_zetan(base: u64, items: u64, theta: f64, zetan: f64) -> Zipfian {
        let zeta2theta = zeta(0, 2, theta, 0.0);
        let mut z = Zipfian { base, items, theta, alpha: 1.0 / (1.0 - theta), zeta2theta, zetan, eta: 0.0, count_for_zeta: items };
        z.eta = z.eta_for(items);
        z
    }

    fn eta_for(&self, items: u64) -> f64 {
        (1.0 - (2.0 / items as f64).powf(1.0 - self.theta)) / (1.0 - self.zeta2theta / self.zetan)
    }

    /// A draw over the first `items` items (grows ζ when `items` grew since the last call).
    pub fn next_over<R: Rng>(&mut self, rng: &mut R, items: u64) -> u64 {
        if items != self.count_for_zeta && items > self.count_for_zeta {
            self.zetan = zeta(self.count_for_zeta, items, self.theta, self.zetan);
            self.count_for_zeta = items;
            self.items = items;
            self.eta = self.eta_for(items);
        }
        let u: f64 = rng.gen();
        let uz = u * self.zetan;
        if uz < 1.0 {
            return self.base;
        }
        if uz < 1.0 + 0.5f64.powf(self.theta) {
            return self.base + 1;
        }
        let r = (self.items as f64 * (self.eta * u - self.eta + 1.0).powf(self.alpha)) as u64;
        self.base + r.min(self.items - 1)
    }

    pub fn next<R: Rng>(&mut self, rng: &mut R) -> u64 {
        let n = self.items;
        self.next_over(rng, n)
    }
}

/// YCSB's `ScrambledZipfianGenerator` over [min, max].
#[derive(Clone, Debug)]
pub struct ScrambledZipfian {
    min: u64,
    count: u64,
    zipf: Zipfian,
}

impl ScrambledZipfian {
    pub fn new(min: u64, max: u64) -> ScrambledZipfian {
        // YCSB: ZipfianGenerator(0, ITEM_COUNT, 0.99, ZETAN): items = ITEM_COUNT + 1
        ScrambledZipfian { min, count: max - min + 1, zipf: Zipfian::with_zetan(0, SCRAMBLED_ITEMS + 1, ZIPFIAN_CONSTANT, SCRAMBLED_ZETAN) }
    }

    pub fn next<R: Rng>(&mut self, rng: &mut R) -> u64 {
        let r = self.zipf.next(rng);
        self.min + (fnv64(r as i64) as u64) % self.count
    }

    #[cfg(test)]
    /// The key the most popular Zipf item (item 0, probability 1/ζ) lands on.
    pub fn hottest(&self) -> u64 {
        self.min + (fnv64(0) as u64) % self.count
    }
}

/// How run-phase operations choose an existing key.
#[derive(Clone, Debug)]
pub enum KeyChooser {
    Uniform,
    Zipfian(ScrambledZipfian),
    /// newest minus a Zipf draw over the keys inserted so far
    Latest(Box<Zipfian>),
}

impl KeyChooser {
    /// A key number in [0, last] (`last` = the highest key number known to be inserted).
    pub fn next<R: Rng>(&mut self, rng: &mut R, last: u64) -> u64 {
        match self {
            KeyChooser::Uniform => rng.gen_range(0..=last),
            KeyChooser::Zipfian(z) => loop {
                // keys not inserted yet are drawn again (YCSB CoreWorkload.nextKeynum)
                let k = z.next(rng);
                if k <= last {
                    return k;
                }
            },
            KeyChooser::Latest(z) => {
                let d = z.next_over(rng, last + 1);
                last - d.min(last)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::SmallRng;
    use rand::SeedableRng;

    #[test]
    fn fnv_matches_hand_computation() {
        // FNV-1a of eight zero bytes: h = ((basis ^ 0) * prime) ... eight times
        let mut h: u64 = FNV_OFFSET_BASIS_64;
        for _ in 0..8 {
            h = h.wrapping_mul(FNV_PRIME_64);
        }
        assert_eq!(fnv64(0), (h as i64).wrapping_abs());
        assert!(fnv64(1) >= 0 && fnv64(12345) >= 0);
        assert_ne!(fnv64(1), fnv64(2));
    }

    #[test]
    fn zeta_of_the_scrambled_space_is_ycsbs_constant() {
        // ζ(n, θ) ≈ ζ(m, θ) + ∫_{m}^{n} x^-θ dx (Euler–Maclaurin, m = 10^6 summed exactly)
        let m = 1_000_000u64;
        let zm = zeta(0, m, 0.99, 0.0);
        let n = 1e10f64;
        let tail = (n.powf(0.01) - (m as f64).powf(0.01)) / 0.01 + 0.5 * (n.powf(-0.99) - (m as f64).powf(-0.99));
        assert!((zm + tail - SCRAMBLED_ZETAN).abs() < 1e-3, "{}", zm + tail);
    }

    #[test]
    fn rank_one_and_two_have_their_zipf_frequencies() {
        let n = 1000u64;
        let mut z = Zipfian::new(0, n, 0.99);
        let mut rng = SmallRng::seed_from_u64(7);
        let draws = 200_000u64;
        let mut c = [0u64; 3];
        let mut max = 0;
        for _ in 0..draws {
            let k = z.next(&mut rng);
            max = max.max(k);
            if k < 3 {
                c[k as usize] += 1;
            }
        }
        assert!(max < n);
        let zn = zeta(0, n, 0.99, 0.0);
        for (rank, count) in c.iter().take(2).enumerate() {
            let p = 1.0 / ((rank + 1) as f64).powf(0.99) / zn;
            let sd = (draws as f64 * p * (1.0 - p)).sqrt();
            let diff = (*count as f64 - draws as f64 * p).abs();
            assert!(diff < 5.0 * sd, "rank {}: {count} vs {}", rank + 1, draws as f64 * p);
        }
    }

    #[test]
    fn scrambled_hot_key_has_one_over_zeta_and_keys_cover_the_space() {
        let n = 10_000u64;
        let mut z = ScrambledZipfian::new(0, n - 1);
        let mut rng = SmallRng::seed_from_u64(11);
        let draws = 400_000u64;
        let mut hits = vec![0u32; n as usize];
        for _ in 0..draws {
            let k = z.next(&mut rng);
            assert!(k < n);
            hits[k as usize] += 1;
        }
        // item 0 has probability 1/ζ; the other 10^10 items add on average (1 - 1/ζ)/n to a key
        let p = 1.0 / SCRAMBLED_ZETAN + (1.0 - 1.0 / SCRAMBLED_ZETAN) / n as f64;
        let got = hits[z.hottest() as usize] as f64;
        let sd = (draws as f64 * p * (1.0 - p)).sqrt();
        assert!((got - draws as f64 * p).abs() < 6.0 * sd, "hot key {got} vs {}", draws as f64 * p);
        let touched = hits.iter().filter(|h| **h > 0).count();
        assert!(touched as f64 > 0.95 * n as f64, "only {touched} of {n} keys drawn");
        // the top 1 % of keys take far more than 1 % of the draws (skew survives the hashing)
        let mut sorted = hits.clone();
        sorted.sort_unstable_by(|a, b| b.cmp(a));
        let top: u64 = sorted[..(n / 100) as usize].iter().map(|h| *h as u64).sum();
        assert!(top as f64 > 0.10 * draws as f64, "top 1 % got {top}");
    }

    #[test]
    fn latest_prefers_the_newest_keys() {
        let mut k = KeyChooser::Latest(Box::new(Zipfian::new(0, 100, 0.99)));
        let mut rng = SmallRng::seed_from_u64(3);
        let mut newest = 0;
        for _ in 0..10_000 {
            let v = k.next(&mut rng, 999);
            assert!(v <= 999);
            if v == 999 {
                newest += 1;
            }
        }
        let p = 1.0 / zeta(0, 1000, 0.99, 0.0);
        assert!((newest as f64 - 10_000.0 * p).abs() < 5.0 * (10_000.0 * p * (1.0 - p)).sqrt(), "{newest}");
    }
}
