//! The run's clock and schedule: seconds since the start, the phase (ramp-up, run, ramp-down)
//! an instant falls in, the timer grid wake-ups are aligned to, and when closed-loop users start.

use std::time::Duration;

use super::ctx::Ctx;

impl Ctx {
    #[inline]
    pub(super) fn now_s(&self) -> f64 {
        self.t0.elapsed().as_secs_f64()
    }
    #[inline]
    pub(super) fn ns_at(&self, s: f64) -> i64 {
        self.t0_ns + (s * 1e9) as i64
    }
    #[inline]
    pub(super) fn align(&self, s: f64) -> f64 {
        if self.quantum_s > 0.0 {
            (s / self.quantum_s).round() * self.quantum_s
        } else {
            s
        }
    }
    pub(super) fn phase_at(&self, s: f64) -> u8 {
        if s < self.wl.ramp_up_s {
            0
        } else if s < self.wl.ramp_up_s + self.wl.run_s {
            1
        } else {
            2
        }
    }
    pub(super) async fn sleep_until_s(&self, s: f64) {
        if s > self.now_s() {
            tokio::time::sleep_until(tokio::time::Instant::from_std(self.t0 + Duration::from_secs_f64(s))).await;
        }
    }
    /// When closed-loop user `u` of `n` starts: spread evenly over the ramp-up.
    pub(super) fn ramp_up_at(&self, u: u32, n: u32) -> f64 {
        if n > 0 {
            self.wl.ramp_up_s * u as f64 / n as f64
        } else {
            0.0
        }
    }
}
