//! The start of a session: the startup packet (SSL and GSSAPI requests declined, cancel requests
//! dropped), SCRAM-SHA-256 with the lab's user and password, the served database, and the first
//! backend's server parameters sent to the client.

use tokio::io::AsyncWriteExt;

use super::client::{Fail, SResult, Session};
use crate::middleware::scram;
use crate::middleware::wire;

impl Session {
    pub(super) async fn startup(&mut self) -> SResult<bool> {
        let params = loop {
            self.fill(4).await?;
            let p = self.io.inpos;
            let n = u32::from_be_bytes([self.io.inbuf[p], self.io.inbuf[p + 1], self.io.inbuf[p + 2], self.io.inbuf[p + 3]]) as usize;
            if !(8..=10000).contains(&n) {
                return Err(Fail::End(Some(format!("bad startup packet length {n}"))));
            }
            self.fill(n).await?;
            let (code, params) = wire::parse_startup(&self.io.inbuf[p + 4..p + n])?;
            self.io.inpos += n;
            if code == wire::SSL_REQUEST || code == wire::GSSENC_REQUEST {
                self.io.wr.write_all(b"N").await.map_err(|_| Fail::End(None))?;
                continue;
            }
            if code == wire::CANCEL_REQUEST {
                return Ok(false); // not forwarded: the request runs to its end
            }
            if code != wire::PROTOCOL_V3 {
                let e = wire::error(&format!("unsupported protocol {}.{}", code >> 16, code & 0xFFFF), "0A000", "FATAL");
                let _ = self.io.wr.write_all(&e).await;
                return Ok(false);
            }
            break params;
        };
        let user = params.get("user").cloned().unwrap_or_default();
        if !self.authenticate(&user).await? {
            let msg = format!("password authentication failed for user \"{user}\"");
            let _ = self.io.wr.write_all(&wire::error(&msg, "28P01", "FATAL")).await;
            return Ok(false);
        }
        let db = params.get("database").filter(|d| !d.is_empty()).or_else(|| params.get("user")).cloned().unwrap_or_default();
        if db != self.m.database {
            let msg = format!("database \"{db}\" does not exist (this middleware serves \"{}\")", self.m.database);
            let _ = self.io.wr.write_all(&wire::error(&msg, "3D000", "FATAL")).await;
            return Ok(false);
        }
        self.io.out.extend_from_slice(&wire::auth_ok());
        for (k, v) in self.m.parameters.get().map(Vec::as_slice).unwrap_or(&[]) {
            self.io.out.extend_from_slice(&wire::parameter_status(k, v));
        }
        self.io.out.extend_from_slice(&wire::backend_key(self.id, rand::random::<u32>() >> 1));
        self.io.out.extend_from_slice(&wire::ready(b'I'));
        self.flush().await?;
        Ok(true)
    }

    /// SCRAM-SHA-256 with the lab's user and password (the backends'): true when the client
    /// proved it knows them (AuthenticationSASLFinal is then queued in `out`).
    pub(super) async fn authenticate(&mut self, user: &str) -> SResult<bool> {
        let m = self.m.clone();
        let mut server = scram::Server::new(&m.verifier);
        self.io.wr.write_all(&wire::auth_request(scram::SASL, b"SCRAM-SHA-256\0\0")).await.map_err(|_| Fail::End(None))?;
        let Some(first) = self.sasl_response().await? else { return Ok(false) };
        let Ok((mechanism, first)) = wire::parse_sasl_initial(&first) else { return Ok(false) };
        if mechanism != scram::MECHANISM {
            return Ok(false);
        }
        let Ok(server_first) = server.first(&first) else { return Ok(false) };
        self.io.wr.write_all(&wire::auth_request(scram::SASL_CONTINUE, &server_first)).await.map_err(|_| Fail::End(None))?;
        let Some(fin) = self.sasl_response().await? else { return Ok(false) };
        let proved = match server.finish(&fin) {
            Ok(server_final) if user == m.user => server_final,
            _ => return Ok(false), // the user is checked after the exchange: the answer does not say which was wrong
        };
        self.io.out.extend_from_slice(&wire::auth_request(scram::SASL_FINAL, &proved));
        Ok(true)
    }

    /// The body of the client's next SASL message (type p, at most 10,000 bytes); None for anything else.
    pub(super) async fn sasl_response(&mut self) -> SResult<Option<Vec<u8>>> {
        self.fill(5).await?;
        let p = self.io.inpos;
        let n = u32::from_be_bytes([self.io.inbuf[p + 1], self.io.inbuf[p + 2], self.io.inbuf[p + 3], self.io.inbuf[p + 4]]) as usize;
        if self.io.inbuf[p] != wire::PASSWORD || !(4..=10000).contains(&n) {
            return Ok(None);
        }
        self.fill(1 + n).await?;
        let body = self.io.inbuf[p + 5..p + 1 + n].to_vec();
        self.io.inpos += 1 + n;
        Ok(Some(body))
    }
}
