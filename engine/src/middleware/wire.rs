//! PostgreSQL v3 wire-protocol framing: what the proxy reads and writes (a port of
//! `python/tierscope/middleware/wire.py`). A message is a type byte, a 4-byte big-endian length
//! (counting itself, not the type) and a body; the startup packet has no type byte.

use std::collections::HashMap;

pub const PROTOCOL_V3: u32 = 196_608;
pub const SSL_REQUEST: u32 = 80_877_103;
pub const GSSENC_REQUEST: u32 = 80_877_104;
pub const CANCEL_REQUEST: u32 = 80_877_102;
pub const MAX_MESSAGE: usize = 1 << 30;

// frontend message types
pub const QUERY: u8 = b'Q';
pub const PARSE: u8 = b'P';
pub const BIND: u8 = b'B';
pub const DESCRIBE: u8 = b'D';
pub const EXECUTE: u8 = b'E';
pub const CLOSE: u8 = b'C';
pub const SYNC: u8 = b'S';
pub const FLUSH: u8 = b'H';
pub const TERMINATE: u8 = b'X';

// backend message types
pub const AUTH: u8 = b'R';
pub const PARAMETER_STATUS: u8 = b'S';
pub const READY: u8 = b'Z';
pub const ERROR: u8 = b'E';
pub const NOTICE: u8 = b'N';
pub const NOTIFICATION: u8 = b'A';
pub const PARSE_COMPLETE: u8 = b'1';
pub const BIND_COMPLETE: u8 = b'2';
pub const CLOSE_COMPLETE: u8 = b'3';
pub const COMMAND_COMPLETE: u8 = b'C';
pub const DATA_ROW: u8 = b'D';
pub const ROW_DESCRIPTION: u8 = b'T';
pub const NO_DATA: u8 = b'n';
pub const PARAMETER_DESCRIPTION: u8 = b't';
pub const EMPTY_QUERY: u8 = b'I';
pub const PORTAL_SUSPENDED: u8 = b's';

/// AuthenticationRequest code of the cleartext password method (SASL's are in `scram`)
pub const AUTH_CLEARTEXT: u32 = 3;
/// the frontend's PasswordMessage / SASLInitialResponse / SASLResponse type
pub const PASSWORD: u8 = b'p';

/// AuthenticationSASL (10) offering `mechanisms`, or AuthenticationSASLContinue/Final (11/12) with `data`.
pub fn auth_request(code: u32, data: &[u8]) -> Vec<u8> {
    let mut body = code.to_be_bytes().to_vec();
    body.extend_from_slice(data);
    frame(AUTH, &body)
}

/// The mechanisms of an AuthenticationSASL body (after its code).
pub fn sasl_mechanisms(data: &[u8]) -> Vec<String> {
    data.split(|&b| b == 0).filter(|m| !m.is_empty()).map(|m| String::from_utf8_lossy(m).into_owned()).collect()
}

/// SASLInitialResponse: the chosen mechanism and the client-first-message.
pub fn sasl_initial(mechanism: &str, data: &[u8]) -> Vec<u8> {
    let mut body = mechanism.as_bytes().to_vec();
    body.push(0);
    body.extend_from_slice(&(data.len() as i32).to_be_bytes());
    body.extend_from_slice(data);
    frame(PASSWORD, &body)
}

/// (mechanism, client-first-message) of a SASLInitialResponse.
pub fn parse_sasl_initial(body: &[u8]) -> PResult<(String, Vec<u8>)> {
    let (mechanism, pos) = cstring(body, 0)?;
    let Some(len) = body.get(pos..pos + 4) else {
        return Err(ProtocolError("SASLInitialResponse too short".into()));
    };
    let n = i32::from_be_bytes([len[0], len[1], len[2], len[3]]);
    let data = &body[pos + 4..];
    if n < 0 || n as usize != data.len() {
        return Err(ProtocolError("SASLInitialResponse length does not match".into()));
    }
    Ok((mechanism, data.to_vec()))
}

pub fn is_async(kind: u8) -> bool {
    matches!(kind, NOTICE | PARAMETER_STATUS | NOTIFICATION)
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ProtocolError(pub String);

pub type PResult<T> = Result<T, ProtocolError>;

/// One message: its type and body.
#[derive(Clone, Debug)]
pub struct Message {
    pub kind: u8,
    pub body: Vec<u8>,
}

impl Message {
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        frame_into(out, self.kind, &self.body);
    }
}

pub fn frame_into(out: &mut Vec<u8>, kind: u8, body: &[u8]) {
    out.push(kind);
    out.extend_from_slice(&((body.len() + 4) as u32).to_be_bytes());
    out.extend_from_slice(body);
}

pub fn frame(kind: u8, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(body.len() + 5);
    frame_into(&mut out, kind, body);
    out
}

/// The body length announced by the 5-byte message header at `pos`.
pub fn header_length(buf: &[u8], pos: usize) -> PResult<usize> {
    let n = u32::from_be_bytes([buf[pos + 1], buf[pos + 2], buf[pos + 3], buf[pos + 4]]) as usize;
    if !(4..=MAX_MESSAGE).contains(&n) {
        return Err(ProtocolError(format!("bad message length {n} for type {:?}", buf[pos] as char)));
    }
    Ok(n - 4)
}

/// The NUL-terminated string at `pos` and the position after its NUL.
pub fn cstring(body: &[u8], pos: usize) -> PResult<(String, usize)> {
    let rest = body.get(pos..).unwrap_or(&[]);
    match memchr::memchr(0, rest) {
        Some(end) => Ok((String::from_utf8_lossy(&rest[..end]).into_owned(), pos + end + 1)),
        None => Err(ProtocolError("unterminated string".into())),
    }
}

fn push_cstr(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(s.as_bytes());
    out.push(0);
}

// --- startup -------------------------------------------------------------------------------------

/// The protocol code and parameters of a startup packet body (after its length).
pub fn parse_startup(body: &[u8]) -> PResult<(u32, HashMap<String, String>)> {
    if body.len() < 4 {
        return Err(ProtocolError("startup packet too short".into()));
    }
    let code = u32::from_be_bytes([body[0], body[1], body[2], body[3]]);
    let mut params = HashMap::new();
    if code == PROTOCOL_V3 {
        let mut pos = 4;
        while pos < body.len() && body[pos] != 0 {
            let (k, p) = cstring(body, pos)?;
            let (v, p) = cstring(body, p)?;
            params.insert(k, v);
            pos = p;
        }
    }
    Ok((code, params))
}

pub fn startup_message(params: &[(&str, &str)]) -> Vec<u8> {
    let mut body = PROTOCOL_V3.to_be_bytes().to_vec();
    for (k, v) in params {
        push_cstr(&mut body, k);
        push_cstr(&mut body, v);
    }
    body.push(0);
    let mut out = ((body.len() + 4) as u32).to_be_bytes().to_vec();
    out.extend_from_slice(&body);
    out
}

// --- frontend messages ---------------------------------------------------------------------------

pub fn query(sql: &str) -> Vec<u8> {
    let mut body = Vec::with_capacity(sql.len() + 1);
    push_cstr(&mut body, sql);
    frame(QUERY, &body)
}

pub fn query_text(body: &[u8]) -> PResult<String> {
    Ok(cstring(body, 0)?.0)
}

/// A Parse message: statement name, SQL text, and the parameter types kept as sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Parse {
    pub name: String,
    pub sql: String,
    pub types: Vec<u8>,
    /// what the statement is (read, write, COPY), once classified
    pub kind: std::sync::OnceLock<super::sql::Kind>,
    /// what it touches (the row scheduler), once read
    pub shape: std::sync::OnceLock<super::scope::Shape>,
}

impl Parse {
    pub fn decode(body: &[u8]) -> PResult<Parse> {
        let (name, pos) = cstring(body, 0)?;
        let (sql, pos) = cstring(body, pos)?;
        Ok(Parse { name, sql, types: body[pos..].to_vec(), kind: std::sync::OnceLock::new(), shape: std::sync::OnceLock::new() })
    }

    /// The message with another name and (optionally) another text.
    /// What the statement is (classified once per Parse object).
    pub fn kind(&self) -> super::sql::Kind {
        *self.kind.get_or_init(|| super::sql::kind_of(&self.sql))
    }

    pub fn shape(&self) -> &super::scope::Shape {
        self.shape.get_or_init(|| super::scope::shape(&self.sql))
    }

    pub fn encode_as(&self, name: &str, sql: Option<&str>, out: &mut Vec<u8>) {
        let sql = sql.unwrap_or(&self.sql);
        let mut body = Vec::with_capacity(name.len() + sql.len() + 2 + self.types.len());
        push_cstr(&mut body, name);
        push_cstr(&mut body, sql);
        body.extend_from_slice(&self.types);
        frame_into(out, PARSE, &body);
    }
}

/// A Bind message: portal, statement, and the rest (formats, values, result formats) kept as sent.
pub struct Bind<'a> {
    pub portal: String,
    pub statement: String,
    pub rest: &'a [u8],
}

impl<'a> Bind<'a> {
    pub fn decode(body: &'a [u8]) -> PResult<Bind<'a>> {
        let (portal, pos) = cstring(body, 0)?;
        let (statement, pos) = cstring(body, pos)?;
        Ok(Bind { portal, statement, rest: &body[pos..] })
    }

    pub fn encode_for(&self, statement: &str, out: &mut Vec<u8>) {
        let mut body = Vec::with_capacity(self.portal.len() + statement.len() + 2 + self.rest.len());
        push_cstr(&mut body, &self.portal);
        push_cstr(&mut body, statement);
        body.extend_from_slice(self.rest);
        frame_into(out, BIND, &body);
    }
}

/// The body of Describe and Close: 'S' (statement) or 'P' (portal) and a name.
pub struct Target {
    pub what: u8,
    pub name: String,
}

impl Target {
    pub fn decode(body: &[u8]) -> PResult<Target> {
        match body.first() {
            Some(&w) if w == b'S' || w == b'P' => Ok(Target { what: w, name: cstring(body, 1)?.0 }),
            other => Err(ProtocolError(format!("Describe/Close: expected 'S' or 'P', got {other:?}"))),
        }
    }

    pub fn encode(&self, kind: u8, out: &mut Vec<u8>) {
        let mut body = vec![self.what];
        push_cstr(&mut body, &self.name);
        frame_into(out, kind, &body);
    }
}

// --- backend messages ----------------------------------------------------------------------------

pub fn auth_ok() -> Vec<u8> {
    frame(AUTH, &0u32.to_be_bytes())
}

pub fn parameter_status(name: &str, value: &str) -> Vec<u8> {
    let mut body = Vec::new();
    push_cstr(&mut body, name);
    push_cstr(&mut body, value);
    frame(PARAMETER_STATUS, &body)
}

pub fn backend_key(pid: u32, secret: u32) -> Vec<u8> {
    let mut body = pid.to_be_bytes().to_vec();
    body.extend_from_slice(&secret.to_be_bytes());
    frame(b'K', &body)
}

pub fn ready(status: u8) -> Vec<u8> {
    frame(READY, &[status])
}

pub fn command_complete(tag: &str) -> Vec<u8> {
    let mut body = Vec::new();
    push_cstr(&mut body, tag);
    frame(COMMAND_COMPLETE, &body)
}

pub fn error(message: &str, code: &str, severity: &str) -> Vec<u8> {
    let mut body = Vec::new();
    for (f, v) in [(b'S', severity), (b'V', severity), (b'C', code), (b'M', message)] {
        body.push(f);
        push_cstr(&mut body, v);
    }
    body.push(0);
    frame(ERROR, &body)
}

/// The fields of an ErrorResponse/NoticeResponse body by their code letter.
pub fn error_fields(body: &[u8]) -> HashMap<u8, String> {
    let mut out = HashMap::new();
    let mut pos = 0;
    while pos < body.len() && body[pos] != 0 {
        let code = body[pos];
        match cstring(body, pos + 1) {
            Ok((v, p)) => {
                out.insert(code, v);
                pos = p;
            }
            Err(_) => break,
        }
    }
    out
}

pub fn error_text(body: &[u8]) -> String {
    let f = error_fields(body);
    let get = |c: u8, d: &str| f.get(&c).cloned().unwrap_or_else(|| d.to_string());
    format!("{} {}: {}", get(b'S', "ERROR"), get(b'C', ""), get(b'M', "")).trim().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn framing_round_trip() {
        let p = Parse {
            name: "_pg3_0".into(),
            sql: "SELECT $1".into(),
            types: vec![0, 1, 0, 0, 0, 23],
            kind: Default::default(),
            shape: Default::default(),
        };
        let mut data = Vec::new();
        p.encode_as(&p.name, None, &mut data);
        assert_eq!(data[0], PARSE);
        let n = header_length(&data, 0).unwrap();
        assert_eq!(Parse::decode(&data[5..5 + n]).unwrap(), p);
        let b = Bind::decode(b"\0_pg3_0\0\0\0\0\x01").unwrap();
        assert_eq!((b.portal.as_str(), b.statement.as_str(), b.rest), ("", "_pg3_0", &b"\0\0\0\x01"[..]));
        let s = startup_message(&[("user", "u"), ("database", "d")]);
        let (code, params) = parse_startup(&s[4..]).unwrap();
        assert_eq!(code, PROTOCOL_V3);
        assert_eq!(params.get("database").map(String::as_str), Some("d"));
        let e = error("boom", "23505", "ERROR");
        assert_eq!(error_fields(&e[5..]).get(&b'C').map(String::as_str), Some("23505"));
        assert_eq!(error_text(&e[5..]), "ERROR 23505: boom");
        assert!(header_length(&[b'Q', 0, 0, 0, 2], 0).is_err());
    }
}
