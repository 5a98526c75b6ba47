//! SCRAM-SHA-256 (RFC 5802 / 7677) as PostgreSQL speaks it, both ends: the middleware logs in to
//! its backends with it (`Client`) and asks its own clients for it (`Server`), with the lab's user
//! and password. No channel binding (the lab's connections are not TLS): the GS2 header is "n,,".
//!
//! The PostgreSQL messages around it: AuthenticationSASL (R, code 10, the mechanisms), the
//! client's SASLInitialResponse (p: mechanism, length, client-first-message),
//! AuthenticationSASLContinue (R, 11, server-first-message), SASLResponse (p: client-final-message),
//! AuthenticationSASLFinal (R, 12, server-final-message), then AuthenticationOk.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use hmac::{Hmac, KeyInit, Mac};
use sha2::{Digest, Sha256};

pub const MECHANISM: &str = "SCRAM-SHA-256";
/// PostgreSQL's scram_iterations default
pub const ITERATIONS: u32 = 4096;
/// AuthenticationRequest codes
pub const SASL: u32 = 10;
pub const SASL_CONTINUE: u32 = 11;
pub const SASL_FINAL: u32 = 12;

/// A SCRAM exchange that failed: a bad message, a wrong password, or a server that did not prove itself.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ScramError(pub String);

fn err<T>(msg: &str) -> Result<T, ScramError> {
    Err(ScramError(msg.to_string()))
}

fn hmac(key: &[u8], msg: &[u8]) -> [u8; 32] {
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(key).expect("HMAC takes a key of any length");
    mac.update(msg);
    mac.finalize().into_bytes().into()
}

fn sha256(data: &[u8]) -> [u8; 32] {
    Sha256::digest(data).into()
}

/// Hi(password, salt, i): PBKDF2-HMAC-SHA-256 with one block (PostgreSQL applies no SASLprep to ASCII).
pub fn salted_password(password: &str, salt: &[u8], iterations: u32) -> [u8; 32] {
    let mut first = salt.to_vec();
    first.extend_from_slice(&1u32.to_be_bytes());
    let mut u = hmac(password.as_bytes(), &first);
    let mut out = u;
    for _ in 1..iterations {
        u = hmac(password.as_bytes(), &u);
        for (o, x) in out.iter_mut().zip(u.iter()) {
            *o ^= x;
        }
    }
    out
}

fn attrs(message: &str) -> Result<Vec<(char, &str)>, ScramError> {
    message
        .split(',')
        .map(|part| {
            let mut chars = part.chars();
            match (chars.next(), part.as_bytes().get(1)) {
                (Some(c), Some(b'=')) => Ok((c, &part[2..])),
                _ => err("bad SCRAM attribute"),
            }
        })
        .collect()
}

fn attr<'a>(list: &[(char, &'a str)], key: char) -> Option<&'a str> {
    list.iter().find(|(k, _)| *k == key).map(|(_, v)| *v)
}

fn nonce() -> String {
    let bytes: [u8; 18] = rand::random();
    B64.encode(bytes)
}

fn xor(a: &[u8], b: &[u8]) -> Vec<u8> {
    a.iter().zip(b).map(|(x, y)| x ^ y).collect()
}

/// The client's half: `first()`, then `finish(server_first)`, then `verify(server_final)`.
pub struct Client {
    password: String,
    nonce: String,
    first_bare: String,
    server_signature: [u8; 32],
}

impl Client {
    pub fn new(password: &str) -> Client {
        let nonce = nonce();
        Client { password: password.to_string(), first_bare: format!("n=,r={nonce}"), nonce, server_signature: [0; 32] }
    }

    pub fn first(&self) -> Vec<u8> {
        format!("n,,{}", self.first_bare).into_bytes()
    }

    pub fn finish(&mut self, server_first: &[u8]) -> Result<Vec<u8>, ScramError> {
        let text = std::str::from_utf8(server_first).map_err(|_| ScramError("server-first-message is not UTF-8".into()))?;
        let a = attrs(text)?;
        let (Some(r), Some(s), Some(i)) = (attr(&a, 'r'), attr(&a, 's'), attr(&a, 'i')) else {
            return err("server-first-message lacks r, s or i");
        };
        if !r.starts_with(&self.nonce) {
            return err("the server's first SCRAM message does not continue our nonce");
        }
        let salt = B64.decode(s).map_err(|_| ScramError("bad salt".into()))?;
        let iterations: u32 = i.parse().map_err(|_| ScramError("bad iteration count".into()))?;
        let salted = salted_password(&self.password, &salt, iterations);
        let without_proof = format!("c=biws,r={r}");
        let auth = format!("{},{text},{without_proof}", self.first_bare);
        let client_key = hmac(&salted, b"Client Key");
        let stored_key = sha256(&client_key);
        self.server_signature = hmac(&hmac(&salted, b"Server Key"), auth.as_bytes());
        let proof = xor(&client_key, &hmac(&stored_key, auth.as_bytes()));
        Ok(format!("{without_proof},p={}", B64.encode(proof)).into_bytes())
    }

    pub fn verify(&self, server_final: &[u8]) -> Result<(), ScramError> {
        let text = std::str::from_utf8(server_final).map_err(|_| ScramError("server-final-message is not UTF-8".into()))?;
        let a = attrs(text)?;
        if let Some(e) = attr(&a, 'e') {
            return Err(ScramError(format!("the server refused: {e}")));
        }
        let v = attr(&a, 'v').and_then(|v| B64.decode(v).ok()).unwrap_or_default();
        if v != self.server_signature {
            return err("the server's SCRAM signature is wrong (it does not know the password)");
        }
        Ok(())
    }
}

/// What a server keeps of a password (computed once: PBKDF2's rounds are not paid per connection).
pub struct Verifier {
    salt: Vec<u8>,
    iterations: u32,
    stored_key: [u8; 32],
    server_key: [u8; 32],
}

impl Verifier {
    pub fn new(password: &str) -> Verifier {
        let salt: [u8; 16] = rand::random();
        let salted = salted_password(password, &salt, ITERATIONS);
        Verifier {
            salt: salt.to_vec(),
            iterations: ITERATIONS,
            stored_key: sha256(&hmac(&salted, b"Client Key")),
            server_key: hmac(&salted, b"Server Key"),
        }
    }
}

/// The server's half for one client: `first(client_first)` -> server-first-message,
/// `finish(client_final)` -> server-final-message (an error when the proof is wrong).
pub struct Server<'a> {
    v: &'a Verifier,
    client_first_bare: String,
    server_first: String,
    nonce: String,
}

impl<'a> Server<'a> {
    pub fn new(v: &'a Verifier) -> Server<'a> {
        Server { v, client_first_bare: String::new(), server_first: String::new(), nonce: String::new() }
    }

    pub fn first(&mut self, client_first: &[u8]) -> Result<Vec<u8>, ScramError> {
        let text = String::from_utf8_lossy(client_first);
        if !(text.starts_with("n,") || text.starts_with("y,")) {
            return err("channel binding is not supported");
        }
        let parts: Vec<&str> = text.splitn(3, ',').collect();
        if parts.len() != 3 {
            return err("bad client-first-message");
        }
        self.client_first_bare = parts[2].to_string();
        let a = attrs(&self.client_first_bare)?;
        let cnonce = attr(&a, 'r').filter(|r| !r.is_empty()).ok_or_else(|| ScramError("no client nonce".into()))?;
        self.nonce = format!("{cnonce}{}", nonce());
        self.server_first = format!("r={},s={},i={}", self.nonce, B64.encode(&self.v.salt), self.v.iterations);
        Ok(self.server_first.clone().into_bytes())
    }

    pub fn finish(&self, client_final: &[u8]) -> Result<Vec<u8>, ScramError> {
        let text = String::from_utf8_lossy(client_final);
        let Some(at) = text.rfind(",p=") else {
            return err("client-final-message without a proof");
        };
        let (head, proof_b64) = (&text[..at], &text[at + 3..]);
        let a = attrs(head)?;
        if attr(&a, 'r') != Some(self.nonce.as_str()) {
            return err("client-final-message with another nonce");
        }
        let auth = format!("{},{},{head}", self.client_first_bare, self.server_first);
        let proof = B64.decode(proof_b64).map_err(|_| ScramError("bad proof".into()))?;
        if proof.len() != 32 {
            return err("bad proof");
        }
        let client_key = xor(&proof, &hmac(&self.v.stored_key, auth.as_bytes()));
        if sha256(&client_key) != self.v.stored_key {
            return err("wrong password");
        }
        Ok(format!("v={}", B64.encode(hmac(&self.v.server_key, auth.as_bytes()))).into_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_and_server_agree_and_a_wrong_password_fails() {
        let v = Verifier::new("secret");
        let mut c = Client::new("secret");
        let mut s = Server::new(&v);
        let sf = s.first(&c.first()).unwrap();
        let cf = c.finish(&sf).unwrap();
        let fin = s.finish(&cf).unwrap();
        c.verify(&fin).unwrap();

        let mut bad = Client::new("guess");
        let mut s = Server::new(&v);
        let sf = s.first(&bad.first()).unwrap();
        let cf = bad.finish(&sf).unwrap();
        assert!(s.finish(&cf).is_err());
    }

    #[test]
    fn hi_matches_rfc7677() {
        // RFC 7677's example: user "user", password "pencil", salt W22ZaJ0SNY7soEsUEjb6gQ==, i=4096
        let salt = B64.decode("W22ZaJ0SNY7soEsUEjb6gQ==").unwrap();
        let salted = salted_password("pencil", &salt, 4096);
        let client_first_bare = "n=user,r=rOprNGfwEbeRWgbNEkqO";
        let server_first = "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096";
        let without_proof = "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0";
        let auth = format!("{client_first_bare},{server_first},{without_proof}");
        let client_key = hmac(&salted, b"Client Key");
        let proof = xor(&client_key, &hmac(&sha256(&client_key), auth.as_bytes()));
        assert_eq!(B64.encode(proof), "dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=");
    }
}
