//! MySQL client/server protocol framing for the middleware (pure functions): a port of
//! `python/tierscope/middleware/mysql_wire.py`.
//!
//! A packet is a 3-byte little-endian payload length, a 1-byte sequence id and the payload; a
//! payload of 2^24-1 bytes or more is split over several packets (the last one shorter). A command
//! starts a new sequence at 0 and its answer continues it. What the middleware uses: the server
//! handshake (protocol 10), the client's HandshakeResponse41 with mysql_native_password, OK/ERR/EOF
//! packets, and `Response`, which follows the answer to one COM_QUERY or COM_STMT_EXECUTE to tell
//! where it ends. Neither side uses CLIENT_DEPRECATE_EOF or CLIENT_SESSION_TRACK, so the backends'
//! answers pass to the clients byte for byte.

pub const MAX_PAYLOAD: usize = 0xFF_FFFF;

// commands
pub const COM_QUIT: u8 = 0x01;
pub const COM_INIT_DB: u8 = 0x02;
pub const COM_QUERY: u8 = 0x03;
pub const COM_PING: u8 = 0x0E;
pub const COM_STMT_PREPARE: u8 = 0x16;
pub const COM_STMT_EXECUTE: u8 = 0x17;
pub const COM_STMT_SEND_LONG_DATA: u8 = 0x18;
pub const COM_STMT_CLOSE: u8 = 0x19;
pub const COM_STMT_RESET: u8 = 0x1A;
pub const COM_SET_OPTION: u8 = 0x1B;
pub const COM_STMT_FETCH: u8 = 0x1C;
pub const COM_RESET_CONNECTION: u8 = 0x1F;

// capability flags
pub const LONG_PASSWORD: u32 = 1;
pub const LONG_FLAG: u32 = 1 << 2;
pub const CONNECT_WITH_DB: u32 = 1 << 3;
pub const PROTOCOL_41: u32 = 1 << 9;
pub const SSL: u32 = 1 << 11;
pub const TRANSACTIONS: u32 = 1 << 13;
pub const SECURE_CONNECTION: u32 = 1 << 15;
pub const MULTI_STATEMENTS: u32 = 1 << 16;
pub const MULTI_RESULTS: u32 = 1 << 17;
pub const PS_MULTI_RESULTS: u32 = 1 << 18;
pub const PLUGIN_AUTH: u32 = 1 << 19;
pub const CONNECT_ATTRS: u32 = 1 << 20;
pub const PLUGIN_AUTH_LENENC: u32 = 1 << 21;
/// never offered nor asked for (the answers pass byte for byte)
#[cfg(test)]
pub const DEPRECATE_EOF: u32 = 1 << 24;

/// what the middleware asks of its backends: fixed, so every pooled connection answers alike
pub const BACKEND_CAPS: u32 = LONG_PASSWORD
    | LONG_FLAG
    | CONNECT_WITH_DB
    | PROTOCOL_41
    | TRANSACTIONS
    | SECURE_CONNECTION
    | MULTI_STATEMENTS
    | MULTI_RESULTS
    | PS_MULTI_RESULTS
    | PLUGIN_AUTH;
/// what the middleware offers its clients: the backends' set plus what only concerns the login
/// (no SSL, compression, LOCAL INFILE, session tracking or DEPRECATE_EOF)
pub const SERVER_CAPS: u32 = BACKEND_CAPS | CONNECT_ATTRS | PLUGIN_AUTH_LENENC;

// server status flags
pub const STATUS_IN_TRANS: u16 = 0x0001;
pub const STATUS_AUTOCOMMIT: u16 = 0x0002;
pub const STATUS_MORE_RESULTS: u16 = 0x0008;

pub const UTF8MB4_GENERAL_CI: u8 = 45;
pub const NATIVE_PASSWORD: &str = "mysql_native_password";

// error codes the middleware sends itself
pub const ER_ACCESS_DENIED: u16 = 1045;
pub const ER_BAD_DB: u16 = 1049;
pub const ER_UNKNOWN_COM: u16 = 1047;
pub const ER_NOT_SUPPORTED_YET: u16 = 1235;
pub const ER_UNKNOWN_ERROR: u16 = 1105;
pub const ER_UNKNOWN_STMT_HANDLER: u16 = 1243;

/// The peer sent something this proxy does not understand or support.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MyError {
    #[error("packet too short: {0}")]
    Short(&'static str),
    #[error("bad length-encoded integer 0x{0:02x}")]
    BadLenenc(u8),
    #[error("expected a protocol 10 handshake, got first byte {0:?}")]
    NotV10(Option<u8>),
    #[error("the client does not speak protocol 4.1")]
    NotProtocol41,
    #[error("the client asks for SSL, which the middleware does not offer")]
    SslAsked,
    #[error("the backend asks for a LOCAL INFILE, which the middleware does not support")]
    LocalInfile,
    #[error("expected EOF after the column definitions, got 0x{0:02x}")]
    ExpectedEof(u8),
    #[error("a packet after the end of the answer")]
    AfterEnd,
}

pub type MyResult<T> = Result<T, MyError>;

// --- framing -------------------------------------------------------------------------------------

/// `payload` framed as packets from sequence id `seq` (split at 2^24-1 bytes), appended to `out`.
pub fn packet_into(out: &mut Vec<u8>, seq: u8, payload: &[u8]) {
    let mut seq = seq;
    let mut pos = 0;
    loop {
        let chunk = &payload[pos..(pos + MAX_PAYLOAD).min(payload.len())];
        let n = chunk.len() as u32;
        out.extend_from_slice(&n.to_le_bytes()[..3]);
        out.push(seq);
        out.extend_from_slice(chunk);
        seq = seq.wrapping_add(1);
        pos += chunk.len();
        if chunk.len() < MAX_PAYLOAD {
            return;
        }
    }
}

pub fn packet(seq: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(payload.len() + 4);
    packet_into(&mut out, seq, payload);
    out
}

/// (payload length, sequence id) of the packet header at `pos` (4 bytes there).
pub fn header(buf: &[u8], pos: usize) -> (usize, u8) {
    (buf[pos] as usize | (buf[pos + 1] as usize) << 8 | (buf[pos + 2] as usize) << 16, buf[pos + 3])
}

fn le(buf: &[u8], pos: usize, n: usize) -> MyResult<u64> {
    let b = buf.get(pos..pos + n).ok_or(MyError::Short("integer"))?;
    Ok(b.iter().rev().fold(0u64, |a, &x| a << 8 | x as u64))
}

pub fn u16_at(buf: &[u8], pos: usize) -> MyResult<u16> {
    le(buf, pos, 2).map(|v| v as u16)
}

pub fn u32_at(buf: &[u8], pos: usize) -> MyResult<u32> {
    le(buf, pos, 4).map(|v| v as u32)
}

/// The length-encoded integer at `pos` and the position after it.
pub fn lenenc_int(buf: &[u8], pos: usize) -> MyResult<(u64, usize)> {
    let b = *buf.get(pos).ok_or(MyError::Short("length-encoded integer"))?;
    match b {
        0..=0xFA => Ok((b as u64, pos + 1)),
        0xFC => Ok((le(buf, pos + 1, 2)?, pos + 3)),
        0xFD => Ok((le(buf, pos + 1, 3)?, pos + 4)),
        0xFE => Ok((le(buf, pos + 1, 8)?, pos + 9)),
        _ => Err(MyError::BadLenenc(b)),
    }
}

pub fn lenenc_into(out: &mut Vec<u8>, n: u64) {
    if n < 0xFB {
        out.push(n as u8);
    } else if n < 1 << 16 {
        out.push(0xFC);
        out.extend_from_slice(&n.to_le_bytes()[..2]);
    } else if n < 1 << 24 {
        out.push(0xFD);
        out.extend_from_slice(&n.to_le_bytes()[..3]);
    } else {
        out.push(0xFE);
        out.extend_from_slice(&n.to_le_bytes());
    }
}

pub fn lenenc(n: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(9);
    lenenc_into(&mut out, n);
    out
}

fn lenenc_str_into(out: &mut Vec<u8>, s: &[u8]) {
    lenenc_into(out, s.len() as u64);
    out.extend_from_slice(s);
}

/// The NUL-terminated string at `pos` (to the end when there is no NUL) and the position after it.
pub fn cstring(buf: &[u8], pos: usize) -> (&[u8], usize) {
    let rest = buf.get(pos..).unwrap_or(&[]);
    match rest.iter().position(|&c| c == 0) {
        Some(i) => (&rest[..i], pos + i + 1),
        None => (rest, buf.len().max(pos)),
    }
}

// --- authentication ------------------------------------------------------------------------------

/// SHA-1 (FIPS 180-4), for mysql_native_password only.
pub fn sha1(data: &[u8]) -> [u8; 20] {
    let mut h: [u32; 5] = [0x6745_2301, 0xEFCD_AB89, 0x98BA_DCFE, 0x1032_5476, 0xC3D2_E1F0];
    let mut msg = data.to_vec();
    msg.push(0x80);
    while msg.len() % 64 != 56 {
        msg.push(0);
    }
    msg.extend_from_slice(&((data.len() as u64) * 8).to_be_bytes());
    for block in msg.chunks_exact(64) {
        let mut w = [0u32; 80];
        for (i, c) in block.chunks_exact(4).enumerate() {
            w[i] = u32::from_be_bytes([c[0], c[1], c[2], c[3]]);
        }
        for i in 16..80 {
            w[i] = (w[i - 3] ^ w[i - 8] ^ w[i - 14] ^ w[i - 16]).rotate_left(1);
        }
        let [mut a, mut b, mut c, mut d, mut e] = h;
        for (i, &wi) in w.iter().enumerate() {
            let (f, k) = match i {
                0..20 => ((b & c) | (!b & d), 0x5A82_7999),
                20..40 => (b ^ c ^ d, 0x6ED9_EBA1),
                40..60 => ((b & c) | (b & d) | (c & d), 0x8F1B_BCDC),
                _ => (b ^ c ^ d, 0xCA62_C1D6u32),
            };
            let t = a.rotate_left(5).wrapping_add(f).wrapping_add(e).wrapping_add(k).wrapping_add(wi);
            e = d;
            d = c;
            c = b.rotate_left(30);
            b = a;
            a = t;
        }
        for (x, y) in h.iter_mut().zip([a, b, c, d, e]) {
            *x = x.wrapping_add(y);
        }
    }
    let mut out = [0u8; 20];
    for (i, x) in h.iter().enumerate() {
        out[4 * i..4 * i + 4].copy_from_slice(&x.to_be_bytes());
    }
    out
}

/// mysql_native_password's answer: SHA1(pw) XOR SHA1(salt + SHA1(SHA1(pw))); empty for no password.
pub fn scramble_native(password: &str, salt: &[u8]) -> Vec<u8> {
    if password.is_empty() {
        return Vec::new();
    }
    let h1 = sha1(password.as_bytes());
    let h2 = sha1(&h1);
    let mut s = salt[..salt.len().min(20)].to_vec();
    s.extend_from_slice(&h2);
    let h3 = sha1(&s);
    h1.iter().zip(h3).map(|(a, b)| a ^ b).collect()
}

/// A server's greeting (protocol 10).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Handshake {
    pub version: String,
    pub connection_id: u32,
    pub salt: Vec<u8>,
    pub caps: u32,
    pub charset: u8,
    pub status: u16,
    pub plugin: String,
}

/// The server's greeting (payload) offering SERVER_CAPS and mysql_native_password with a 20-byte salt.
pub fn handshake_v10(connection_id: u32, salt: &[u8; 20], version: &str, status: u16) -> Vec<u8> {
    let caps = SERVER_CAPS;
    let mut out = vec![10];
    out.extend_from_slice(version.as_bytes());
    out.push(0);
    out.extend_from_slice(&connection_id.to_le_bytes());
    out.extend_from_slice(&salt[..8]);
    out.push(0);
    out.extend_from_slice(&(caps as u16).to_le_bytes());
    out.push(UTF8MB4_GENERAL_CI);
    out.extend_from_slice(&status.to_le_bytes());
    out.extend_from_slice(&((caps >> 16) as u16).to_le_bytes());
    out.push(21);
    out.extend_from_slice(&[0; 10]);
    out.extend_from_slice(&salt[8..20]);
    out.push(0);
    out.extend_from_slice(NATIVE_PASSWORD.as_bytes());
    out.push(0);
    out
}

pub fn parse_handshake(payload: &[u8]) -> MyResult<Handshake> {
    if payload.first() != Some(&10) {
        return Err(MyError::NotV10(payload.first().copied()));
    }
    let (version, mut pos) = cstring(payload, 1);
    let version = String::from_utf8_lossy(version).into_owned();
    let connection_id = u32_at(payload, pos)?;
    let mut salt = payload.get(pos + 4..pos + 12).ok_or(MyError::Short("handshake"))?.to_vec();
    pos += 13;
    let mut caps = u16_at(payload, pos)? as u32;
    pos += 2;
    let (mut charset, mut status) = (0, 0);
    if payload.len() > pos {
        charset = payload[pos];
        status = u16_at(payload, pos + 1)?;
        caps |= (u16_at(payload, pos + 3)? as u32) << 16;
        let auth_len = *payload.get(pos + 5).ok_or(MyError::Short("handshake"))? as usize;
        pos += 6 + 10;
        if caps & SECURE_CONNECTION != 0 {
            let n = 13.max(auth_len.saturating_sub(8));
            let part = payload.get(pos..(pos + n).min(payload.len())).unwrap_or(&[]);
            let end = part.iter().rposition(|&c| c != 0).map_or(0, |i| i + 1);
            salt.extend_from_slice(&part[..end]);
            pos += n;
        }
    }
    let plugin =
        if caps & PLUGIN_AUTH != 0 && pos < payload.len() { String::from_utf8_lossy(cstring(payload, pos).0).into_owned() } else { String::new() };
    salt.truncate(20);
    Ok(Handshake { version, connection_id, salt, caps, charset, status, plugin })
}

/// A client's HandshakeResponse41.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Login {
    pub caps: u32,
    pub charset: u8,
    pub user: String,
    pub auth: Vec<u8>,
    pub database: Option<String>,
    pub plugin: String,
}

/// The client's HandshakeResponse41 (payload).
pub fn handshake_response(caps: u32, user: &str, auth: &[u8], database: Option<&str>, plugin: &str) -> Vec<u8> {
    let database = database.filter(|d| !d.is_empty());
    let caps = if database.is_some() { caps | CONNECT_WITH_DB } else { caps & !CONNECT_WITH_DB };
    let mut out = Vec::with_capacity(64 + user.len() + auth.len());
    out.extend_from_slice(&caps.to_le_bytes());
    out.extend_from_slice(&(MAX_PAYLOAD as u32).to_le_bytes());
    out.push(UTF8MB4_GENERAL_CI);
    out.extend_from_slice(&[0; 23]);
    out.extend_from_slice(user.as_bytes());
    out.push(0);
    out.push(auth.len() as u8);
    out.extend_from_slice(auth);
    if let Some(db) = database {
        out.extend_from_slice(db.as_bytes());
        out.push(0);
    }
    if caps & PLUGIN_AUTH != 0 {
        out.extend_from_slice(plugin.as_bytes());
        out.push(0);
    }
    out
}

pub fn parse_login(payload: &[u8]) -> MyResult<Login> {
    if payload.len() < 32 {
        return Err(MyError::Short("handshake response"));
    }
    let caps = u32_at(payload, 0)?;
    let charset = payload[8];
    if caps & PROTOCOL_41 == 0 {
        return Err(MyError::NotProtocol41);
    }
    if caps & SSL != 0 && payload.len() == 32 {
        return Err(MyError::SslAsked);
    }
    let (user, mut pos) = cstring(payload, 32);
    let user = String::from_utf8_lossy(user).into_owned();
    let auth = if caps & PLUGIN_AUTH_LENENC != 0 {
        let (n, p) = lenenc_int(payload, pos)?;
        let end = p.saturating_add(n as usize).min(payload.len());
        pos = end;
        payload.get(p..end).unwrap_or(&[]).to_vec()
    } else if caps & SECURE_CONNECTION != 0 {
        let n = *payload.get(pos).ok_or(MyError::Short("auth response"))? as usize;
        let end = (pos + 1 + n).min(payload.len());
        let a = payload[pos + 1..end].to_vec();
        pos = end;
        a
    } else {
        let (a, p) = cstring(payload, pos);
        pos = p;
        a.to_vec()
    };
    let mut database = None;
    if caps & CONNECT_WITH_DB != 0 && pos < payload.len() {
        let (db, p) = cstring(payload, pos);
        pos = p;
        database = Some(String::from_utf8_lossy(db).into_owned()).filter(|d| !d.is_empty());
    }
    let plugin =
        if caps & PLUGIN_AUTH != 0 && pos < payload.len() { String::from_utf8_lossy(cstring(payload, pos).0).into_owned() } else { String::new() };
    Ok(Login { caps, charset, user, auth, database, plugin })
}

pub fn auth_switch(plugin: &str, salt: &[u8]) -> Vec<u8> {
    let mut out = vec![0xFE];
    out.extend_from_slice(plugin.as_bytes());
    out.push(0);
    out.extend_from_slice(&salt[..salt.len().min(20)]);
    out.push(0);
    out
}

// --- OK, ERR, EOF --------------------------------------------------------------------------------

pub fn ok(affected: u64, insert_id: u64, status: u16) -> Vec<u8> {
    let mut out = vec![0];
    lenenc_into(&mut out, affected);
    lenenc_into(&mut out, insert_id);
    out.extend_from_slice(&status.to_le_bytes());
    out.extend_from_slice(&[0, 0]);
    out
}

pub fn err(code: u16, message: &str, state: &str) -> Vec<u8> {
    let mut out = vec![0xFF];
    out.extend_from_slice(&code.to_le_bytes());
    out.push(b'#');
    let mut st: Vec<u8> = state.bytes().take(5).collect();
    st.resize(5, b'0');
    out.extend_from_slice(&st);
    out.extend_from_slice(message.as_bytes());
    out
}

pub fn eof(status: u16) -> Vec<u8> {
    let mut out = vec![0xFE, 0, 0];
    out.extend_from_slice(&status.to_le_bytes());
    out
}

/// A whole text-protocol answer (packets from sequence id 1): one VARCHAR column, one row per value.
pub fn text_result(column: &str, values: &[&str], status: u16) -> Vec<u8> {
    let mut coldef = Vec::new();
    lenenc_str_into(&mut coldef, b"def");
    for _ in 0..3 {
        lenenc_str_into(&mut coldef, b"");
    }
    lenenc_str_into(&mut coldef, column.as_bytes());
    lenenc_str_into(&mut coldef, b"");
    coldef.push(0x0C);
    coldef.extend_from_slice(&(UTF8MB4_GENERAL_CI as u16).to_le_bytes());
    coldef.extend_from_slice(&1024u32.to_le_bytes());
    coldef.extend_from_slice(&[0xFD, 0, 0, 0, 0, 0]);
    let mut payloads = vec![lenenc(1), coldef, eof(status)];
    for v in values {
        let mut row = Vec::new();
        lenenc_str_into(&mut row, v.as_bytes());
        payloads.push(row);
    }
    payloads.push(eof(status));
    let mut out = Vec::new();
    for (i, p) in payloads.iter().enumerate() {
        packet_into(&mut out, (i + 1) as u8, p);
    }
    out
}

/// (affected rows, last insert id, status flags) of an OK packet.
pub fn parse_ok(payload: &[u8]) -> MyResult<(u64, u64, u16)> {
    let (affected, pos) = lenenc_int(payload, 1)?;
    let (insert_id, pos) = lenenc_int(payload, pos)?;
    Ok((affected, insert_id, u16_at(payload, pos).unwrap_or(0)))
}

/// (error code, SQLSTATE, message) of an ERR packet.
pub fn parse_err(payload: &[u8]) -> (u16, String, String) {
    let code = u16_at(payload, 1).unwrap_or(0);
    if payload.get(3) == Some(&b'#') {
        let state = String::from_utf8_lossy(payload.get(4..9).unwrap_or(&[])).into_owned();
        return (code, state, String::from_utf8_lossy(payload.get(9..).unwrap_or(&[])).into_owned());
    }
    (code, "HY000".into(), String::from_utf8_lossy(payload.get(3..).unwrap_or(&[])).into_owned())
}

pub fn err_text(payload: &[u8]) -> String {
    let (code, state, message) = parse_err(payload);
    format!("ERROR {code} ({state}): {message}")
}

// --- following an answer -------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum St {
    First,
    Columns,
    ColumnsEof,
    Rows,
}

/// Where the answer to one COM_QUERY or COM_STMT_EXECUTE ends: feed it the packets (first payload
/// byte, payload length, payload) in order until `done`. Notes success, the first error, one tag
/// per statement ("OK <affected rows>" or "ROWS <n>") and the status flags of the last OK/EOF.
#[derive(Debug)]
pub struct Response {
    state: St,
    columns: u64,
    rows: u64,
    pub done: bool,
    pub ok: bool,
    pub error: Option<String>,
    pub tags: Vec<String>,
    pub status: Option<u16>,
    continued: bool,
}

impl Default for Response {
    fn default() -> Self {
        Response { state: St::First, columns: 0, rows: 0, done: false, ok: true, error: None, tags: Vec::new(), status: None, continued: false }
    }
}

impl Response {
    pub fn feed(&mut self, first: Option<u8>, length: usize, payload: &[u8]) -> MyResult<()> {
        if self.done {
            return Err(MyError::AfterEnd);
        }
        if self.continued {
            self.continued = length == MAX_PAYLOAD;
            return Ok(());
        }
        self.continued = length == MAX_PAYLOAD;
        let first = first.unwrap_or(0xFA); // an empty payload: a row's (never an OK/EOF/ERR)
        match self.state {
            St::Rows => {
                if first == 0xFE && length < 9 {
                    let status = if length >= 5 { u16_at(payload, 3)? } else { 0 };
                    self.tags.push(format!("ROWS {}", self.rows));
                    self.end_of_result(status);
                } else if first == 0xFF {
                    self.error(payload);
                } else {
                    self.rows += 1;
                }
            }
            St::First => {
                if first == 0x00 && length >= 7 {
                    let (affected, _, status) = parse_ok(payload)?;
                    self.tags.push(format!("OK {affected}"));
                    self.end_of_result(status);
                } else if first == 0xFF {
                    self.error(payload);
                } else if first == 0xFB {
                    return Err(MyError::LocalInfile);
                } else {
                    self.columns = lenenc_int(payload, 0)?.0;
                    self.rows = 0;
                    self.state = if self.columns > 0 { St::Columns } else { St::ColumnsEof };
                }
            }
            St::Columns => {
                self.columns -= 1;
                if self.columns == 0 {
                    self.state = St::ColumnsEof;
                }
            }
            St::ColumnsEof => {
                if first == 0xFF {
                    self.error(payload);
                } else if !(first == 0xFE && length < 9) {
                    return Err(MyError::ExpectedEof(first));
                } else {
                    self.state = St::Rows;
                }
            }
        }
        Ok(())
    }

    fn end_of_result(&mut self, status: u16) {
        self.status = Some(status);
        self.state = St::First;
        if status & STATUS_MORE_RESULTS == 0 {
            self.done = true;
        }
    }

    fn error(&mut self, payload: &[u8]) {
        self.ok = false;
        if self.error.is_none() {
            self.error = Some(err_text(payload));
        }
        self.done = true; // an error ends the answer (and any further results)
    }
}

/// Whether a connection with these status flags holds no transaction (autocommit on, none open).
pub fn idle(flags: u16) -> bool {
    flags & STATUS_AUTOCOMMIT != 0 && flags & STATUS_IN_TRANS == 0
}

/// time functions fixed by SET timestamp (SYSDATE is not: it reads the clock)
const TIME_FUNCTIONS: [&str; 12] = [
    "NOW",
    "CURRENT_TIMESTAMP",
    "CURRENT_DATE",
    "CURRENT_TIME",
    "CURDATE",
    "CURTIME",
    "LOCALTIME",
    "LOCALTIMESTAMP",
    "UNIX_TIMESTAMP",
    "UTC_TIMESTAMP",
    "UTC_DATE",
    "UTC_TIME",
];

/// How many time functions `text` calls (outside literals and comments).
pub fn time_functions(text: &str) -> usize {
    super::sql::tokens(text).iter().filter(|t| t.kind == super::sql::TokKind::Word && TIME_FUNCTIONS.contains(&t.text.as_str())).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed(r: &mut Response, payloads: &[Vec<u8>]) {
        for p in payloads {
            r.feed(p.first().copied(), p.len(), p).unwrap();
        }
    }

    #[test]
    fn sha1_and_the_native_password_scramble_match_their_definitions() {
        let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
        assert_eq!(hex(&sha1(b"abc")), "a9993e364706816aba3e25717850c26c9cd0d89d");
        assert_eq!(hex(&sha1(b"")), "da39a3ee5e6b4b0d3255bfef95601890afd80709");
        let long = b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
        assert_eq!(hex(&sha1(long)), "84983e441c3bd26ebaae4aa1f95129e5e54670f1");
        // the Python middleware's value for this salt and password (mysql_wire.scramble_native)
        let salt: Vec<u8> = (1..=20).collect();
        let h1 = sha1(b"secret");
        let mut s = salt.clone();
        s.extend_from_slice(&sha1(&h1));
        let h3 = sha1(&s);
        let expect: Vec<u8> = h1.iter().zip(h3).map(|(a, b)| a ^ b).collect();
        assert_eq!(scramble_native("secret", &salt), expect);
        assert!(scramble_native("", &salt).is_empty());
    }

    #[test]
    fn the_greeting_and_the_login_round_trip() {
        let salt = *b"abcdefghijklmnopqrst";
        let hs = parse_handshake(&handshake_v10(7, &salt, "5.5.5-10.11.6-MariaDB", STATUS_AUTOCOMMIT)).unwrap();
        assert_eq!((hs.version.as_str(), hs.connection_id, hs.salt.as_slice()), ("5.5.5-10.11.6-MariaDB", 7, &salt[..]));
        assert_eq!(hs.plugin, NATIVE_PASSWORD);
        assert!(hs.caps & PROTOCOL_41 != 0 && hs.caps & DEPRECATE_EOF == 0 && hs.caps & PLUGIN_AUTH_LENENC != 0);
        assert_eq!((hs.status, hs.charset), (STATUS_AUTOCOMMIT, UTF8MB4_GENERAL_CI));
        let auth = scramble_native("pw", &salt);
        let login = parse_login(&handshake_response(BACKEND_CAPS, "tierscope", &auth, Some("rubbos"), NATIVE_PASSWORD)).unwrap();
        assert_eq!(
            (login.user.as_str(), &login.auth, login.database.as_deref(), login.plugin.as_str()),
            ("tierscope", &auth, Some("rubbos"), NATIVE_PASSWORD)
        );
        let login = parse_login(&handshake_response(BACKEND_CAPS, "u", b"", None, NATIVE_PASSWORD)).unwrap();
        assert_eq!((login.database, login.auth.len()), (None, 0));
        // a client sending the auth response length-encoded (PLUGIN_AUTH_LENENC), as libmariadb does
        let mut p = (BACKEND_CAPS | PLUGIN_AUTH_LENENC | CONNECT_WITH_DB).to_le_bytes().to_vec();
        p.extend_from_slice(&[0, 0, 0, 1, 45]);
        p.extend_from_slice(&[0; 23]);
        p.extend_from_slice(b"nobody\0\x03abcdb\0caching_sha2_password\0");
        let login = parse_login(&p).unwrap();
        assert_eq!(
            (login.user.as_str(), login.auth.as_slice(), login.database.as_deref(), login.plugin.as_str()),
            ("nobody", &b"abc"[..], Some("db"), "caching_sha2_password")
        );
        assert_eq!(parse_login(&p[..20]), Err(MyError::Short("handshake response")));
        let mut old = p.clone();
        old[1] &= !((PROTOCOL_41 >> 8) as u8);
        assert_eq!(parse_login(&old), Err(MyError::NotProtocol41));
        assert_eq!(parse_handshake(b"\x09x"), Err(MyError::NotV10(Some(9))));
        assert_eq!(auth_switch(NATIVE_PASSWORD, &salt)[..1], [0xFE]);
    }

    #[test]
    fn packets_split_at_16_mib_and_integers_are_length_encoded() {
        let mut big = vec![COM_QUERY];
        big.resize(MAX_PAYLOAD + 1, b'x');
        let data = packet(0, &big);
        let (n1, s1) = header(&data, 0);
        let (n2, s2) = header(&data, 4 + n1);
        assert_eq!((n1, s1, n2, s2, data.len()), (MAX_PAYLOAD, 0, 1, 1, big.len() + 8));
        // exactly 2^24-1 bytes: an empty packet follows
        let exact = packet(3, &big[..MAX_PAYLOAD]);
        assert_eq!((exact.len(), header(&exact, 4 + MAX_PAYLOAD)), (MAX_PAYLOAD + 8, (0, 4)));
        assert_eq!(packet(5, b"\x0e"), [1, 0, 0, 5, 0x0e]);
        for n in [0u64, 250, 251, 300, 65535, 65536, 1 << 24, 1 << 30, u64::MAX] {
            let e = lenenc(n);
            assert_eq!(lenenc_int(&e, 0), Ok((n, e.len())), "{n}");
        }
        assert_eq!(lenenc(300), [0xFC, 0x2C, 0x01]);
        assert_eq!(lenenc_int(&[0xFF], 0), Err(MyError::BadLenenc(0xFF)));
        assert_eq!(lenenc_int(&[0xFC, 1], 0), Err(MyError::Short("integer")));
        assert_eq!(cstring(b"ab\0cd", 0), (&b"ab"[..], 3));
        assert_eq!(cstring(b"ab\0cd", 3), (&b"cd"[..], 5));
    }

    #[test]
    fn ok_err_and_eof_packets_encode_and_decode() {
        assert_eq!(parse_ok(&ok(3, 300, STATUS_IN_TRANS)), Ok((3, 300, STATUS_IN_TRANS)));
        let e = err(1062, "Duplicate entry '1' for key 'PRIMARY'", "23000");
        assert_eq!(parse_err(&e), (1062, "23000".into(), "Duplicate entry '1' for key 'PRIMARY'".into()));
        assert_eq!(err_text(&err(1045, "no", "28")), "ERROR 1045 (28000): no");
        assert_eq!(parse_err(b"\xff\x15\x04old style"), (1045, "HY000".into(), "old style".into()));
        assert_eq!(eof(STATUS_AUTOCOMMIT), [0xFE, 0, 0, 2, 0]);
        assert!(idle(STATUS_AUTOCOMMIT) && !idle(STATUS_AUTOCOMMIT | STATUS_IN_TRANS) && !idle(0));
        // the @@socket answer: a whole result set the follower accepts
        let data = text_result("@@socket", &[""], STATUS_AUTOCOMMIT);
        let mut r = Response::default();
        let mut pos = 0;
        let mut seqs = Vec::new();
        while pos < data.len() {
            let (n, s) = header(&data, pos);
            seqs.push(s);
            let p = &data[pos + 4..pos + 4 + n];
            r.feed(p.first().copied(), n, p).unwrap();
            pos += 4 + n;
        }
        assert!(r.done && r.ok);
        assert_eq!((r.tags, seqs), (vec!["ROWS 1".to_string()], vec![1, 2, 3, 4, 5]));
    }

    #[test]
    fn the_answer_follower_finds_the_end_of_ok_err_and_result_sets() {
        let mut r = Response::default();
        feed(&mut r, &[ok(3, 9, STATUS_AUTOCOMMIT | STATUS_IN_TRANS)]);
        assert!(r.done && r.ok && r.tags == ["OK 3"] && r.status == Some(STATUS_AUTOCOMMIT | STATUS_IN_TRANS));
        let mut r = Response::default();
        feed(&mut r, &[err(1064, "syntax", "42000")]);
        assert!(r.done && !r.ok && r.error.as_deref() == Some("ERROR 1064 (42000): syntax"));
        // two columns, a row starting with a 0xFE-prefixed long string (not an EOF: 9 bytes and more), EOF
        let mut long_row = vec![0xFE];
        long_row.extend_from_slice(&[0; 8]);
        long_row.push(b'x');
        let result =
            [vec![2], b"coldef1".to_vec(), b"coldef2".to_vec(), eof(STATUS_AUTOCOMMIT), b"\x011\x012".to_vec(), long_row, eof(STATUS_AUTOCOMMIT)];
        let mut r = Response::default();
        for (i, p) in result.iter().enumerate() {
            assert!(!r.done, "{i}");
            r.feed(p.first().copied(), p.len(), p).unwrap();
        }
        assert!(r.done && r.tags == ["ROWS 2"]);
        assert_eq!(r.feed(Some(0), 7, &ok(0, 0, 2)), Err(MyError::AfterEnd));
        // two results (a multi-statement): the first OK says more results exist
        let mut r = Response::default();
        feed(&mut r, &[ok(1, 0, STATUS_AUTOCOMMIT | STATUS_MORE_RESULTS)]);
        assert!(!r.done);
        feed(&mut r, &[vec![1], b"c".to_vec(), eof(STATUS_AUTOCOMMIT), b"\x011".to_vec(), eof(STATUS_AUTOCOMMIT)]);
        assert!(r.done && r.tags == ["OK 1", "ROWS 1"]);
        // an error in the middle of the rows ends it
        let mut r = Response::default();
        feed(&mut r, &[vec![1], b"c".to_vec(), eof(STATUS_AUTOCOMMIT), b"\x011".to_vec(), err(1317, "interrupted", "70100")]);
        assert!(r.done && !r.ok && r.error.as_deref().is_some_and(|e| e.contains("1317")));
        // LOCAL INFILE is refused; an empty row (no payload) is a row
        assert_eq!(Response::default().feed(Some(0xFB), 5, b"\xfbfile"), Err(MyError::LocalInfile));
        let mut r = Response::default();
        feed(&mut r, &[vec![1], b"c".to_vec(), eof(STATUS_AUTOCOMMIT)]);
        r.feed(None, 0, b"").unwrap();
        feed(&mut r, &[eof(STATUS_AUTOCOMMIT)]);
        assert!(r.done && r.tags == ["ROWS 1"]);
        let mut r = Response::default();
        feed(&mut r, &[vec![1], b"c".to_vec()]);
        assert_eq!(r.feed(Some(0x03), 3, b"\x03ab"), Err(MyError::ExpectedEof(3)));
    }

    #[test]
    fn time_functions_are_counted_outside_literals_and_comments() {
        assert_eq!(time_functions("INSERT INTO t VALUES (NOW(), CURDATE(), 'now()') /* now() */"), 2);
        assert_eq!(time_functions("UPDATE t SET a = UNIX_TIMESTAMP() + 1"), 1);
        assert_eq!(time_functions("INSERT INTO t VALUES (SYSDATE())"), 0);
        assert_eq!(time_functions("insert into t values (now(6))"), 1);
    }
}
