//! A client connection, either protocol: its bytes (the halves of its socket, what was read and
//! not taken yet, `inbuf` from `inpos`, and the answers queued for it, `out`, written by `flush`)
//! and why a unit of its could not be served (`Fail`).

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;

use super::pool::RECV_SIZE;
use super::NoBackend;

/// Why a unit could not be served: no backend (the client gets an error and the session goes on),
/// or the session must end (with a reason to log, if any).
pub(crate) enum Fail {
    NoBackend(String),
    End(Option<String>),
}

impl From<NoBackend> for Fail {
    fn from(e: NoBackend) -> Fail {
        Fail::NoBackend(e.0)
    }
}

impl From<Closed> for Fail {
    fn from(_: Closed) -> Fail {
        Fail::End(None)
    }
}

pub(crate) type SResult<T> = Result<T, Fail>;

/// The client went away, or its socket failed: the session ends.
#[derive(Debug)]
pub(crate) struct Closed;

pub(crate) struct ClientIo {
    pub(crate) rd: OwnedReadHalf,
    pub(crate) wr: OwnedWriteHalf,
    pub(crate) inbuf: Vec<u8>,
    pub(crate) inpos: usize,
    pub(crate) out: Vec<u8>,
}

impl ClientIo {
    pub(crate) fn new(stream: TcpStream) -> ClientIo {
        let (rd, wr) = stream.into_split();
        ClientIo { rd, wr, inbuf: Vec::with_capacity(8192), inpos: 0, out: Vec::with_capacity(8192) }
    }

    /// Write the queued answers.
    pub(crate) async fn flush(&mut self) -> Result<(), Closed> {
        if !self.out.is_empty() {
            self.wr.write_all(&self.out).await.map_err(|_| Closed)?;
            self.out.clear();
        }
        Ok(())
    }

    /// At least `n` unread bytes in `inbuf` (from `inpos`).
    pub(crate) async fn fill(&mut self, n: usize) -> Result<(), Closed> {
        while self.inbuf.len() - self.inpos < n {
            if self.inpos > 0 {
                self.inbuf.drain(..self.inpos);
                self.inpos = 0;
            }
            self.inbuf.reserve(RECV_SIZE.max(n));
            let k = self.rd.read_buf(&mut self.inbuf).await.map_err(|_| Closed)?;
            if k == 0 {
                return Err(Closed);
            }
        }
        Ok(())
    }
}
