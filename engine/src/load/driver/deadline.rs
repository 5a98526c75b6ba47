//! Request timeouts without a timer-wheel entry per request: a pending request sits in a slot
//! of `Ctx::deadlines` with its deadline and waker; a watchdog task scans the slots every 1/20
//! of the timeout (10 to 500 ms) and wakes the expired ones, which then resolve to a timeout.

use std::rc::Rc;
use std::time::{Duration, Instant};

use super::ctx::Ctx;

/// `fut` under the request timeout: resolves to Err(()) once the timeout has passed.
pub(super) struct Deadline<'a, 'b, F> {
    ctx: &'a Ctx,
    fut: std::pin::Pin<&'b mut F>,
    at: Instant,
    slot: Option<usize>,
}

impl<'a, 'b, F: std::future::Future> Deadline<'a, 'b, F> {
    pub(super) fn new(ctx: &'a Ctx, fut: std::pin::Pin<&'b mut F>) -> Deadline<'a, 'b, F> {
        Deadline { ctx, fut, at: Instant::now() + ctx.request_timeout, slot: None }
    }
}

impl<F: std::future::Future> std::future::Future for Deadline<'_, '_, F> {
    type Output = Result<F::Output, ()>;
    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Self::Output> {
        use std::task::Poll;
        let this = self.get_mut();
        if let Poll::Ready(v) = this.fut.as_mut().poll(cx) {
            return Poll::Ready(Ok(v));
        }
        if this.slot.is_some() && Instant::now() >= this.at {
            return Poll::Ready(Err(()));
        }
        let at = this.at;
        let mut d = this.ctx.deadlines.borrow_mut();
        match this.slot {
            Some(i) => {
                if let Some((_, w)) = &d.slots[i] {
                    if !w.will_wake(cx.waker()) {
                        d.slots[i] = Some((at, cx.waker().clone()));
                    }
                }
            }
            None => {
                let entry = Some((at, cx.waker().clone()));
                let i = match d.free.pop() {
                    Some(i) => {
                        d.slots[i] = entry;
                        i
                    }
                    None => {
                        d.slots.push(entry);
                        d.slots.len() - 1
                    }
                };
                drop(d);
                this.slot = Some(i);
            }
        }
        Poll::Pending
    }
}

impl<F> Drop for Deadline<'_, '_, F> {
    fn drop(&mut self) {
        if let Some(i) = self.slot.take() {
            let mut d = self.ctx.deadlines.borrow_mut();
            d.slots[i] = None;
            d.free.push(i);
        }
    }
}

pub(super) async fn watchdog(ctx: Rc<Ctx>) {
    // a period of 1/20 of the timeout (10 ms .. 500 ms): timeouts fire within ~5 % late,
    // and a long timeout costs few wake-ups
    let period = (ctx.request_timeout / 20).clamp(Duration::from_millis(10), Duration::from_millis(500));
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let now = Instant::now();
        let d = ctx.deadlines.borrow();
        for (at, w) in d.slots.iter().flatten() {
            if *at <= now {
                w.wake_by_ref();
            }
        }
    }
}
