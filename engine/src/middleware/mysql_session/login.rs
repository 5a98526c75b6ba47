//! The login: a protocol-10 greeting offering mysql_native_password, the configured user with the
//! backends' password and the served database only (`COM_INIT_DB` and `USE` of it too).

use rand::Rng;

use super::client::{SResult, Session};
use crate::middleware::mysql_wire as my;

impl Session {
    /// Greet, check the user, the password (mysql_native_password) and the database.
    pub(super) async fn login(&mut self) -> SResult<bool> {
        let mut salt = [0u8; 20];
        {
            let mut rng = rand::thread_rng();
            for s in salt.iter_mut() {
                *s = rng.gen_range(33..=126);
            }
        }
        let version = format!("{}-tierscope-middleware", self.c.version.get().map_or("5.5.5-10.11-MariaDB", String::as_str));
        self.reply(&my::handshake_v10(self.id, &salt, &version, my::STATUS_AUTOCOMMIT), 0);
        self.flush().await?;
        let (mut seq, payload) = self.read_packet(1 << 16).await?;
        let login = my::parse_login(&payload)?;
        let mut auth = login.auth.clone();
        if !login.plugin.is_empty() && login.plugin != my::NATIVE_PASSWORD {
            // ask for mysql_native_password
            self.reply(&my::auth_switch(my::NATIVE_PASSWORD, &salt), seq.wrapping_add(1));
            self.flush().await?;
            (seq, auth) = self.read_packet(1 << 16).await?;
        }
        let seq = seq.wrapping_add(1);
        if login.user != self.m.user || auth != my::scramble_native(&self.c.password, &salt) {
            let msg = format!("Access denied for user '{}' (the middleware accepts user '{}' with the backends' password)", login.user, self.m.user);
            self.reply(&my::err(my::ER_ACCESS_DENIED, &msg, "28000"), seq);
            self.flush().await?;
            return Ok(false);
        }
        if let Some(db) = login.database.as_deref().filter(|d| *d != self.m.database) {
            let e = self.bad_db(db);
            self.reply(&e, seq);
            self.flush().await?;
            return Ok(false);
        }
        self.reply(&my::ok(0, 0, my::STATUS_AUTOCOMMIT), seq);
        self.flush().await?;
        Ok(true)
    }

    pub(super) fn bad_db(&self, name: &str) -> Vec<u8> {
        my::err(my::ER_BAD_DB, &format!("Unknown database '{name}' (this middleware serves '{}')", self.m.database), "42000")
    }

    pub(super) fn use_db(&mut self, name: &str) {
        if name == self.m.database {
            self.reply(&my::ok(0, 0, self.status_flags()), 1);
        } else {
            self.m.count(|c| c.errors_to_clients += 1);
            let e = self.bad_db(name);
            self.reply(&e, 1);
        }
    }
}
