//! At most `--pool` connections to one MariaDB backend: idle ones kept, `acquire` waits for a free
//! slot, a connection given back in a transaction or broken is closed.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Semaphore;

use super::conn::{quit, MyConn};
use crate::middleware::mysql_wire as my;
use crate::middleware::pool::BackendError;

/// At most `size` connections to one MariaDB backend; `acquire` waits for a free one.
pub struct MyPool {
    pub(super) host: String,
    pub(super) port: u16,
    pub(super) user: String,
    pub(super) password: String,
    pub(super) database: String,
    pub(super) idle: Mutex<Vec<MyConn>>,
    pub(super) slots: Arc<Semaphore>,
    pub(super) opened: AtomicU64,
}

impl MyPool {
    pub(super) fn new(host: &str, port: u16, user: &str, password: &str, database: &str, size: usize) -> MyPool {
        MyPool {
            host: host.into(),
            port,
            user: user.into(),
            password: password.into(),
            database: database.into(),
            idle: Mutex::new(Vec::new()),
            slots: Arc::new(Semaphore::new(size)),
            opened: AtomicU64::new(0),
        }
    }

    pub(super) fn idle(&self) -> std::sync::MutexGuard<'_, Vec<MyConn>> {
        self.idle.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) async fn acquire(&self) -> Result<MyConn, BackendError> {
        let permit = self.slots.clone().acquire_owned().await.map_err(|_| BackendError("the pool is closed".into()))?;
        let idle = self.idle().pop();
        let mut conn = match idle {
            Some(mut c) => {
                c.reused = true;
                c
            }
            None => {
                let c = MyConn::open(&self.host, self.port, &self.user, &self.password, &self.database, Duration::from_secs(10)).await?;
                self.opened.fetch_add(1, Ordering::Relaxed);
                c
            }
        };
        conn.permit = Some(permit);
        Ok(conn)
    }

    pub(super) fn release(&self, mut conn: MyConn) {
        let permit = conn.permit.take();
        if !conn.broken && my::idle(conn.status) && conn.pos == conn.buf.len() {
            conn.buf.clear();
            conn.pos = 0;
            self.idle().push(conn);
        } else {
            quit(conn);
        }
        drop(permit);
    }

    pub(super) fn drop_idle(&self) {
        let idle: Vec<MyConn> = std::mem::take(&mut *self.idle());
        for c in idle {
            quit(c);
        }
    }
}
