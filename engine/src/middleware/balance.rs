//! Which backend serves a read: a port of `python/tierscope/middleware/balance.py` (pure
//! functions over the backends' state).
//!
//! Least-Pending-Requests-First is Sequoia's RAIDb1_LPRF rule: scan the backends in configuration
//! order, skip those not enabled, keep the first one whose count of requests executing on it is
//! strictly smaller than the best so far, and stop at the first with none. Round robin is
//! Sequoia's RAIDb1_RR; weighted round robin is nginx's smooth weighted round robin; `lrt` is the
//! least (pending + 1) x recent read latency.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    Lprf,
    Rr,
    Wrr,
    Lrt,
}

impl Policy {
    pub fn name(self) -> &'static str {
        match self {
            Policy::Lprf => "lprf",
            Policy::Rr => "rr",
            Policy::Wrr => "wrr",
            Policy::Lrt => "lrt",
        }
    }
}

/// The index of the backend LPRF picks, or None when no backend is enabled.
pub fn choose_lprf(pending: &[i64], enabled: &[bool]) -> Option<usize> {
    let mut best: Option<(usize, i64)> = None;
    for (i, (&n, &on)) in pending.iter().zip(enabled).enumerate() {
        if !on {
            continue;
        }
        if best.is_none_or(|(_, b)| n < b) {
            best = Some((i, n));
            if n == 0 {
                break;
            }
        }
    }
    best.map(|(i, _)| i)
}

/// Round robin: starting at `next`, the first enabled backend, at most one lap; returns (chosen or
/// None, the index to start from next time).
pub fn choose_rr(next: usize, enabled: &[bool]) -> (Option<usize>, usize) {
    let n = enabled.len();
    for k in 0..n {
        let i = (next + k) % n;
        if enabled[i] {
            return (Some(i), (i + 1) % n);
        }
    }
    (None, if n > 0 { next % n } else { 0 })
}

/// Smooth weighted round robin: every enabled backend's `current` grows by its weight, the largest
/// is chosen (ties: the earliest) and loses the total. Disabled backends keep their value.
pub fn choose_wrr(current: &mut [f64], weights: &[f64], enabled: &[bool]) -> Option<usize> {
    let mut total = 0.0;
    let mut best: Option<usize> = None;
    for i in 0..current.len() {
        if !enabled[i] || weights[i] <= 0.0 {
            continue;
        }
        current[i] += weights[i];
        total += weights[i];
        if best.is_none_or(|b| current[i] > current[b]) {
            best = Some(i);
        }
    }
    if let Some(b) = best {
        current[b] -= total;
    }
    best
}

/// Least (pending + 1) x recent read latency among the enabled backends; a backend with no latency
/// yet scores 0, so each is tried once before the averages decide; ties: the earliest.
pub fn choose_lrt(pending: &[i64], latency_s: &[Option<f64>], enabled: &[bool]) -> Option<usize> {
    let mut best: Option<(usize, f64)> = None;
    for i in 0..pending.len() {
        if !enabled[i] {
            continue;
        }
        let score = (pending[i] + 1) as f64 * latency_s[i].unwrap_or(0.0);
        if best.is_none_or(|(_, b)| score < b) {
            best = Some((i, score));
        }
    }
    best.map(|(i, _)| i)
}

/// The exponentially weighted moving average after `sample` (the sample itself at first).
pub fn ewma(previous: Option<f64>, sample: f64) -> f64 {
    match previous {
        None => sample,
        Some(p) => p + 0.2 * (sample - p),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lprf_takes_the_first_least_pending() {
        let cases: [(&[i64], &[bool], Option<usize>); 6] = [
            (&[0, 0], &[true, true], Some(0)),
            (&[1, 0], &[true, true], Some(1)),
            (&[2, 1, 1], &[true, true, true], Some(1)),
            (&[0, 0], &[false, true], Some(1)),
            (&[3, 5], &[true, false], Some(0)),
            (&[0, 0], &[false, false], None),
        ];
        for (pending, enabled, chosen) in cases {
            assert_eq!(choose_lprf(pending, enabled), chosen, "{pending:?} {enabled:?}");
        }
    }

    #[test]
    fn lprf_sequence_of_reads_that_do_not_finish() {
        let mut pending = [0i64; 3];
        let mut seq = Vec::new();
        for _ in 0..6 {
            let i = choose_lprf(&pending, &[true; 3]).unwrap();
            pending[i] += 1;
            seq.push(i);
        }
        assert_eq!(seq, [0, 1, 2, 0, 1, 2]);
    }

    #[test]
    fn round_robin_skips_disabled_backends() {
        let mut next = 0;
        let mut seq = Vec::new();
        for k in 0..6 {
            let enabled = [true, k < 3, true];
            let (i, n) = choose_rr(next, &enabled);
            next = n;
            seq.push(i.unwrap());
        }
        assert_eq!(seq, [0, 1, 2, 0, 2, 0]);
        assert_eq!(choose_rr(1, &[false, false]), (None, 1));
    }

    #[test]
    fn smooth_weighted_round_robin_interleaves_by_weight() {
        let mut cur = [0.0; 3];
        let seq: Vec<usize> = (0..7).map(|_| choose_wrr(&mut cur, &[5.0, 1.0, 1.0], &[true; 3]).unwrap()).collect();
        assert_eq!(seq, [0, 0, 1, 0, 2, 0, 0]);
        assert_eq!(cur, [0.0, 0.0, 0.0]); // a whole cycle brings every current back to 0
        let mut cur = [0.0; 2];
        let seq: Vec<usize> = (0..4).map(|_| choose_wrr(&mut cur, &[3.0, 1.0], &[true, true]).unwrap()).collect();
        assert_eq!(seq, [0, 0, 1, 0]);
        assert_eq!(choose_wrr(&mut [0.0, 0.0], &[1.0, 0.0], &[false, true]), None);
    }

    #[test]
    fn least_response_time_times_in_flight() {
        assert_eq!(choose_lrt(&[0, 0], &[None, None], &[true, true]), Some(0));
        assert_eq!(choose_lrt(&[0, 0], &[Some(0.02), None], &[true, true]), Some(1));
        assert_eq!(choose_lrt(&[0, 0], &[Some(0.02), Some(0.001)], &[true, true]), Some(1));
        assert_eq!(choose_lrt(&[0, 30], &[Some(0.002), Some(0.001)], &[true, true]), Some(0));
        assert_eq!(choose_lrt(&[0, 0], &[Some(0.02), Some(0.001)], &[true, false]), Some(0));
        assert_eq!(ewma(None, 1.0), 1.0);
        assert!((ewma(Some(1.0), 2.0) - 1.2).abs() < 1e-12);
    }
}
