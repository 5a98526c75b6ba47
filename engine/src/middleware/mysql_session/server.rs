//! The MySQL-protocol front end of the server (`middleware::serve`): the cluster's own pools are
//! the backends' connections.

use std::sync::Arc;
use std::time::Duration;

use super::client::Session;
use super::cluster::Cluster;
use crate::middleware::serve::Front;
use crate::middleware::{Manager, NoBackend};

impl Front for Cluster {
    const NAME: &'static str = " (mysql)";

    fn manager(self: &Arc<Self>) -> Arc<Manager> {
        self.m.clone()
    }

    async fn check_backends(&self, timeout: Duration) -> Result<(), NoBackend> {
        Cluster::check_backends(self, timeout).await
    }

    async fn recover(&self) -> Result<(), NoBackend> {
        Cluster::recover(self).await
    }

    fn spawn_session(self: &Arc<Self>, stream: tokio::net::TcpStream, id: u32) {
        tokio::spawn(Session::new(self.clone(), stream, id).run());
    }

    async fn rejoin(&self, i: usize) -> crate::middleware::recover::Rejoin {
        crate::middleware::recover::rejoin(&self.m, self, i).await
    }

    fn drop_idle(&self) {
        for p in &self.pools {
            p.drop_idle();
        }
    }

    fn stats(&self) -> serde_json::Value {
        Cluster::stats(self)
    }
}
