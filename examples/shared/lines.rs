//! What the line-protocol servers (`kv`, `queue`) share: which shard owns a key, their limits,
//! their read of a connection's next bytes, how they close one that sent a line over
//! [`LINE_MAX`], and the client their self-checks drive them with.

use std::{
    hash::{Hash, Hasher},
    net::SocketAddr,
};

use xtc::net::TcpStream;

/// The shard that owns `key` (a key, a queue's name). `DefaultHasher::new()` has fixed keys,
/// so every shard (and every run) agrees.
pub(crate) fn owner(key: &[u8]) -> usize {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    key.hash(&mut h);
    (h.finish() % xtc::shard::count() as u64) as usize
}

/// The longest request line the line-protocol servers (`kv`, `queue`) serve, without its `\n`.
pub(crate) const LINE_MAX: usize = 1 << 20;

/// The most room such a server's connection keeps for a partial line between reads.
pub(crate) const PENDING_KEPT: usize = 64 << 10;

/// Replies such a server buffers for one connection before it writes them out.
pub(crate) const REPLY_CHUNK: usize = 64 << 10;

/// Closes a connection whose client sent a line over [`LINE_MAX`], once its `ERR` is written:
/// closed with the client's input unread, the socket sends a reset, and a client that sends
/// everything before it reads (`nc -N`) lost the `ERR` to it. So this ends our side, then reads
/// the rest away (into `buf`, for at most a few seconds) before the stream is dropped.
pub(crate) async fn close_after_refusal(stream: TcpStream, buf: Vec<u8>) {
    let _ = stream.shutdown(std::net::Shutdown::Write);
    let mut b = buf;
    let _ = xtc::time::timeout(std::time::Duration::from_secs(5), async move {
        loop {
            let (n, r) = stream.read(b).await;
            b = r;
            if !matches!(n, Ok(n) if n > 0) {
                return;
            }
        }
    })
    .await;
}

/// Reads the next bytes of a line-protocol connection onto `pending` (through `buf`, kept
/// for the next read): `Some(false)` when bytes came, `Some(true)` at the peer's end of
/// stream with an unfinished last line (given its `\n`, so that it is answered too), `None`
/// when the connection is over (its end with nothing pending, or an error).
pub(crate) async fn read_more(
    stream: &TcpStream,
    buf: &mut Vec<u8>,
    pending: &mut Vec<u8>,
) -> Option<bool> {
    let (n, b) = stream.read(std::mem::take(buf)).await;
    *buf = b;
    match n {
        Ok(n) if n > 0 => {
            pending.extend_from_slice(&buf[..n]);
            Some(false)
        }
        Ok(_) if !pending.is_empty() => {
            pending.push(b'\n');
            Some(true)
        }
        _ => None,
    }
}

/// A client connection that sends one line and reads one reply line.
pub(crate) struct Client {
    stream: TcpStream,
    buf: Vec<u8>,
    got: Vec<u8>,
    /// Requests answered (`drive`'s count of work done); `None` for no client's work (a
    /// final check's requests).
    progress: Option<crate::shared::Progress>,
}

impl Client {
    /// Connects to `addr` (no Nagle delay: one small line at a time).
    pub(crate) async fn connect(
        addr: SocketAddr,
        progress: Option<crate::shared::Progress>,
    ) -> std::io::Result<Self> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        Ok(Client {
            stream,
            buf: Vec::with_capacity(4096),
            got: Vec::new(),
            progress,
        })
    }

    /// Sends `line` (with its `\n`) and returns the reply line, without its `\n`.
    pub(crate) async fn call(&mut self, line: String) -> std::io::Result<String> {
        let (w, _) = self.stream.write_all(line.into_bytes()).await;
        w?;
        loop {
            if let Some(i) = self.got.iter().position(|&c| c == b'\n') {
                let reply = String::from_utf8_lossy(&self.got[..i]).into_owned();
                self.got.drain(..=i);
                if let Some(p) = &self.progress {
                    p.add(1);
                }
                return Ok(reply);
            }
            let (n, b) = self.stream.read(std::mem::take(&mut self.buf)).await;
            let n = n?;
            if n == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            self.got.extend_from_slice(&b[..n]);
            self.buf = b;
        }
    }
}
