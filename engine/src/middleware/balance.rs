//! Which backend serves a read: a port of `python/tierscope/middleware/balance.py` (pure
//! functions over the backends' state).
//!
//! Least-Pending-Requests-First is Sequoia's RAIDb1_LPRF rule: scan the backends in configuration
//! order, skip those not enabled, keep the first one whose count of requests executing on it is
//! strictly smaller than the best so far, and stop at the first with none. Round robin is
//! Sequoia's RAIDb1_RR; weighted round robin is nginx's smooth weighted round robin; `lrt` is the
//! least (pending + 1) x recent read latency.
//!
//! The resource-aware policy (`aware`) knows *what* each replica is busy with: every read has a
//! label (its statement text with literals replaced, `sql::label`), the manager keeps each label's
//! moving-average service time, and a replica's score is its expected wait, the sum over the
//! requests in flight there of their expected remaining service time (`expected_remaining`: the
//! label's average minus the time already spent, never below a quarter of the average; a write or a
//! read of an unknown label counts as the typical read). The read goes to the replica with the
//! smallest expected wait (ties: fewer pending, then the earliest); a heavy read (`heavy_labels`)
//! joins a replica already running heavy reads when it would wait there at most as long as it runs.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    Lprf,
    Rr,
    Wrr,
    Lrt,
    Aware,
}

impl Policy {
    pub fn name(self) -> &'static str {
        match self {
            Policy::Lprf => "lprf",
            Policy::Rr => "rr",
            Policy::Wrr => "wrr",
            Policy::Lrt => "lrt",
            Policy::Aware => "aware",
        }
    }

    /// every policy, in the order of the contract (python/tierscope/contracts/middleware.json)
    pub const ALL: [Policy; 5] = [Policy::Lprf, Policy::Rr, Policy::Wrr, Policy::Lrt, Policy::Aware];

    pub fn parse(name: &str) -> Option<Policy> {
        Policy::ALL.into_iter().find(|p| p.name() == name)
    }
}

/// a request past its label's average is expected to take at least this share of the average more
pub const REMAINING_FLOOR: f64 = 0.25;
/// a label is heavy when its average is more than this many times the typical read's (--heavy-factor)
pub const HEAVY_FACTOR: f64 = 10.0;
/// ... and above this many seconds (nothing is heavy at sub-millisecond scale)
pub const HEAVY_FLOOR_S: f64 = 0.005;

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

/// The expected remaining service of a request whose label takes `expected_s` on average and which
/// has run `elapsed_s`: the difference, but at least a quarter of the average (a request past its
/// average is not about to end for sure).
pub fn expected_remaining(expected_s: f64, elapsed_s: f64) -> f64 {
    (expected_s - elapsed_s).max(REMAINING_FLOOR * expected_s)
}

/// A replica's expected wait at `now`: the expected remaining service of its requests in flight,
/// given as (expected seconds, started at), plus `others` requests (writes, reads without a label
/// yet) of `typical_s` each.
pub fn expected_wait(inflight: impl IntoIterator<Item = (f64, f64)>, now: f64, others: i64, typical_s: f64) -> f64 {
    inflight.into_iter().map(|(expected, started)| expected_remaining(expected, now - started)).sum::<f64>() + others as f64 * typical_s
}

/// The enabled backend with the smallest expected wait; ties: fewer pending, then the earliest.
///
/// For a heavy read (`heavy_own`: the heavy reads in flight per backend and its own expected
/// service): the backend already running the most heavy reads (ties: the smaller wait) if the read
/// would wait there at most as long as it runs, so heavy reads share as few replicas as possible;
/// otherwise the rule above.
pub fn choose_aware(wait_s: &[f64], pending: &[i64], enabled: &[bool], heavy_own: Option<(&[i64], f64)>) -> Option<usize> {
    if let Some((heavy, own_s)) = heavy_own {
        let mut best: Option<usize> = None;
        for i in 0..wait_s.len() {
            if enabled[i] && heavy[i] > 0 && wait_s[i] <= own_s {
                // Python: (h, -w) > (heavy[best], -wait[best])
                if best.is_none_or(|b| heavy[i] > heavy[b] || (heavy[i] == heavy[b] && wait_s[i] < wait_s[b])) {
                    best = Some(i);
                }
            }
        }
        if best.is_some() {
            return best;
        }
    }
    let mut best: Option<usize> = None;
    for i in 0..wait_s.len() {
        if !enabled[i] {
            continue;
        }
        if best.is_none_or(|b| wait_s[i] < wait_s[b] || (wait_s[i] == wait_s[b] && pending[i] < pending[b])) {
            best = Some(i);
        }
    }
    best
}

/// The lower weighted median: the smallest value whose cumulative weight reaches half the total
/// (None when there is no weight).
pub fn weighted_median(values: &[f64], weights: &[f64]) -> Option<f64> {
    let mut pairs: Vec<(f64, f64)> = values.iter().zip(weights).filter(|(_, &w)| w > 0.0).map(|(&v, &w)| (v, w)).collect();
    // Python sorts the (value, weight) tuples
    pairs.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.total_cmp(&b.1)));
    let total: f64 = pairs.iter().map(|p| p.1).sum();
    if total <= 0.0 {
        return None;
    }
    let mut acc = 0.0;
    for &(v, w) in &pairs {
        acc += w;
        if acc >= total / 2.0 {
            return Some(v);
        }
    }
    pairs.last().map(|p| p.0)
}

/// The heavy labels (indices into `service_s`) and the typical service time: the typical time is
/// the median over the executions (labels weighted by their counts), and a label is heavy when its
/// average is more than `factor` times the typical time and above HEAVY_FLOOR_S.
pub fn heavy_labels(service_s: &[f64], counts: &[f64], factor: f64) -> (Vec<usize>, Option<f64>) {
    let Some(typical) = weighted_median(service_s, counts) else {
        return (Vec::new(), None);
    };
    let limit = (factor * typical).max(HEAVY_FLOOR_S);
    ((0..service_s.len()).filter(|&i| service_s[i] > limit).collect(), Some(typical))
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

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-12
    }

    #[test]
    fn expected_remaining_never_falls_below_a_quarter_of_the_average() {
        // (average, elapsed, remaining): the cases of tests/test_middleware_aware.py
        for (expected, elapsed, remaining) in
            [(0.100, 0.0, 0.100), (0.100, 0.060, 0.040), (0.100, 0.090, 0.025), (0.100, 0.500, 0.025), (0.0, 0.1, 0.0)]
        {
            assert!(close(expected_remaining(expected, elapsed), remaining), "{expected} {elapsed}");
        }
    }

    #[test]
    fn expected_wait_sums_the_reads_in_flight_and_counts_the_others_as_typical() {
        // a heavy read (200 ms average) 50 ms in, and two light ones (1 ms) just started
        let inflight = [(0.200, 9.950), (0.001, 10.0), (0.001, 10.0)];
        assert!(close(expected_wait(inflight, 10.0, 0, 0.0), 0.152));
        assert!(close(expected_wait(inflight, 10.0, 3, 0.001), 0.155));
        assert_eq!(expected_wait([], 10.0, 0, 0.001), 0.0);
        // the heavy read past its average still counts a quarter of it
        assert!(close(expected_wait([(0.200, 9.0)], 10.0, 0, 0.0), 0.050));
    }

    #[test]
    fn aware_takes_the_least_expected_wait_then_fewer_pending_then_the_earliest() {
        let on = [true, true];
        assert_eq!(choose_aware(&[0.150, 0.002], &[1, 2], &on, None), Some(1)); // LPRF would take 0
        assert_eq!(choose_aware(&[0.002, 0.150], &[2, 1], &on, None), Some(0));
        assert_eq!(choose_aware(&[0.0, 0.0], &[0, 0], &on, None), Some(0));
        assert_eq!(choose_aware(&[0.001, 0.001], &[2, 1], &on, None), Some(1));
        assert_eq!(choose_aware(&[0.0, 0.5], &[0, 3], &[false, true], None), Some(1));
        assert_eq!(choose_aware(&[0.0], &[0], &[false], None), None);
    }

    #[test]
    fn aware_scores_replicas_by_the_labels_they_run() {
        let now = 100.0;
        let typical = 0.001;
        // replica 0 runs a heavy read (300 ms average, 100 ms in); replica 1 runs three light reads
        // (1 ms) and a read of a label not known yet (counted as the typical read)
        let waits = [expected_wait([(0.300, 99.9)], now, 0, typical), expected_wait([(0.001, now); 3], now, 1, typical)];
        assert!(close(waits[0], 0.200) && close(waits[1], 0.004));
        assert_eq!(choose_aware(&waits, &[1, 4], &[true, true], None), Some(1)); // LPRF: [1, 4] -> 0
        assert_eq!(choose_lprf(&[1, 4], &[true, true]), Some(0));
        // 2 s past its average, the heavy read still counts 75 ms: more than the light queue's 4 ms
        let late = expected_wait([(0.300, 97.7)], now, 0, typical);
        assert!(close(late, 0.075));
        assert_eq!(choose_aware(&[late, waits[1]], &[1, 4], &[true, true], None), Some(1));
        // a second heavy read joins the first when it would wait there at most its own time
        assert_eq!(choose_aware(&waits, &[1, 4], &[true, true], Some((&[1, 0], 0.300))), Some(0));
        assert_eq!(choose_aware(&waits, &[1, 4], &[true, true], Some((&[1, 0], 0.150))), Some(1));
        // the replica with the most heavy reads, then the smaller wait
        assert_eq!(choose_aware(&[0.2, 0.1, 0.3], &[1, 1, 2], &[true; 3], Some((&[1, 1, 2], 0.4))), Some(2));
        assert_eq!(choose_aware(&[0.2, 0.1, 0.3], &[1, 1, 2], &[true, true, false], Some((&[1, 1, 2], 0.4))), Some(1));
    }

    #[test]
    fn aware_with_alike_requests_is_least_pending() {
        let mut pending = [0i64; 3];
        let mut seq = Vec::new();
        for _ in 0..6 {
            let waits: Vec<f64> = pending.iter().map(|&n| 0.001 * n as f64).collect();
            let i = choose_aware(&waits, &pending, &[true; 3], None).unwrap();
            assert_eq!(Some(i), choose_lprf(&pending, &[true; 3]));
            pending[i] += 1;
            seq.push(i);
        }
        assert_eq!(seq, [0, 1, 2, 0, 1, 2]);
    }

    #[test]
    fn weighted_median_and_heavy_labels() {
        assert_eq!(weighted_median(&[5.0, 1.0, 3.0], &[1.0, 1.0, 1.0]), Some(3.0));
        assert_eq!(weighted_median(&[1.0, 100.0], &[95.0, 5.0]), Some(1.0)); // the typical execution
        assert_eq!(weighted_median(&[1.0, 100.0], &[1.0, 1.0]), Some(1.0)); // the lower median
        assert_eq!(weighted_median(&[1.0], &[0.0]), None);
        // light, medium, heavy
        assert_eq!(heavy_labels(&[0.001, 0.004, 0.120], &[950.0, 40.0, 10.0], HEAVY_FACTOR), (vec![2], Some(0.001)));
        // at sub-millisecond scale nothing is heavy (the floor: 5 ms)
        assert_eq!(heavy_labels(&[0.0001, 0.003], &[10.0, 1.0], HEAVY_FACTOR).0, Vec::<usize>::new());
        assert_eq!(heavy_labels(&[], &[], HEAVY_FACTOR), (vec![], None));
        // more than factor x typical: 10 ms is not heavy at factor 10 over 1 ms, 10.1 ms is
        assert_eq!(heavy_labels(&[0.001, 0.010, 0.0101], &[10.0, 1.0, 1.0], 10.0).0, vec![2]);
    }
}
