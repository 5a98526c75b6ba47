//! The timer grid's edges as a place to wait: responses of paced (closed-loop, think time > 0)
//! requests are picked up at the next grid edge instead of waking the event loop when they
//! arrive (the driver's grid has an edge every millisecond, or every quantum if that is
//! shorter, so a pick-up comes less than 1 ms after the response). One timer per run serves every waiter of an edge, and the edge is the same tokio tick
//! the users due at it wake on, so a grid interval costs one wake-up of the event loop for its
//! requests and the responses to the previous ones (it cost one per request and one per
//! response). The instants stay exact: a response's time is the kernel's receive timestamp of
//! its bytes (`http::Conn`), not the time it was picked up.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use tokio::time::Sleep;

pub struct Grid {
    t0: Instant,
    quantum: Duration,
    /// edges passed so far (a waiter is done once this moved past the value it started with)
    gen: Cell<u64>,
    waiters: RefCell<Vec<Waker>>,
    /// the one timer, set to the next edge while anyone waits
    sleep: RefCell<Option<Pin<Box<Sleep>>>>,
    armed: Cell<bool>,
}

impl Grid {
    /// Edges at `t0 + k * quantum` (quantum > 0).
    pub fn new(t0: Instant, quantum: Duration) -> Grid {
        Grid { t0, quantum, gen: Cell::new(0), waiters: RefCell::new(Vec::new()), sleep: RefCell::new(None), armed: Cell::new(false) }
    }

    /// Resolves at the next grid edge after now.
    pub fn next_edge(&self) -> EdgeWait<'_> {
        EdgeWait { grid: self, gen: self.gen.get(), registered: false }
    }

    fn edge_after_now(&self) -> Instant {
        let q = self.quantum.as_nanos().max(1);
        let k = self.t0.elapsed().as_nanos() / q + 1;
        self.t0 + Duration::from_nanos((k * q) as u64)
    }

    fn fire(&self) {
        self.gen.set(self.gen.get() + 1);
        self.armed.set(false);
        for w in self.waiters.borrow_mut().drain(..) {
            w.wake();
        }
    }
}

pub struct EdgeWait<'a> {
    grid: &'a Grid,
    gen: u64,
    registered: bool,
}

impl Future for EdgeWait<'_> {
    type Output = ();
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        let g = this.grid;
        if g.gen.get() != this.gen {
            this.registered = false;
            return Poll::Ready(());
        }
        let fired = {
            let mut slot = g.sleep.borrow_mut();
            if !g.armed.get() {
                let at = tokio::time::Instant::from_std(g.edge_after_now());
                match slot.as_mut() {
                    Some(s) => s.as_mut().reset(at),
                    None => *slot = Some(Box::pin(tokio::time::sleep_until(at))),
                }
                g.armed.set(true);
            }
            // the timer wakes the last task that polled it; every waiter is woken from `fire`
            slot.as_mut().expect("grid timer").as_mut().poll(cx).is_ready()
        };
        if fired {
            g.fire();
            this.registered = false;
            return Poll::Ready(());
        }
        // once per edge (a scan for duplicates would cost O(waiters) per waiter: a thousand
        // requests in flight would make every edge a million comparisons)
        if !this.registered {
            g.waiters.borrow_mut().push(cx.waker().clone());
        }
        this.registered = true;
        Poll::Pending
    }
}

impl Drop for EdgeWait<'_> {
    fn drop(&mut self) {
        // the timer may hold this task's waker: wake the others so that one of them polls it
        if self.registered && self.grid.gen.get() == self.gen {
            let ws: Vec<Waker> = self.grid.waiters.borrow_mut().drain(..).collect();
            for w in ws {
                w.wake();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "current_thread")]
    async fn waiters_of_an_edge_wake_together_on_it() {
        let t0 = Instant::now();
        let grid = Grid::new(t0, Duration::from_millis(5));
        let (a, b) = (grid.next_edge(), grid.next_edge());
        let ((), ()) = tokio::join!(a, b);
        let e = t0.elapsed();
        assert!(e >= Duration::from_millis(5) && e < Duration::from_millis(60), "{e:?}");
        assert_eq!(grid.gen.get(), 1);
        // a dropped waiter does not strand the others
        let dropped = grid.next_edge();
        let kept = grid.next_edge();
        let mut dropped = Box::pin(dropped);
        let mut kept = Box::pin(kept);
        futures_util::future::poll_fn(|cx| {
            let _ = dropped.as_mut().poll(cx);
            let _ = kept.as_mut().poll(cx);
            Poll::Ready(())
        })
        .await;
        drop(dropped);
        tokio::time::timeout(Duration::from_secs(1), kept).await.expect("the kept waiter resolves");
        assert_eq!(grid.gen.get(), 2);
    }
}
