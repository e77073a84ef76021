//! HTTP basic authentication against bcrypt hashes (the web configuration's
//! `basic_auth_users`).
//!
//! bcrypt is slow on purpose (tens of milliseconds at cost 10), so:
//! - a password that was verified is remembered, by a SHA-256 digest of the user, the
//!   hash and the password (never the password), so a scraper's every request does not
//!   pay for it again;
//! - one verification runs at a time in the process, off the async threads: a client
//!   guessing passwords is slowed down to bcrypt's pace and cannot take the CPU from the
//!   rest of the process;
//! - an unknown user's password is checked against a known user's hash (and refused
//!   whatever the outcome), so the time of a refusal does not say which users exist.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};

use axum::http::HeaderValue;
use sha2::{Digest, Sha256};
use tokio::sync::Semaphore;

/// Passwords verified and remembered at most; the set is emptied when full (a handful of
/// scrapers and people use one process).
const REMEMBERED: usize = 1024;

/// The users allowed in, and their bcrypt hashes.
#[derive(Debug)]
pub struct BasicAuthUsers {
    users: BTreeMap<String, String>,
    remembered: Mutex<HashSet<[u8; 32]>>,
    verifying: Arc<Semaphore>,
}

/// Why a user entry cannot be used: the field it is in is `basic_auth_users.<user>`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("basic_auth_users.{user}: {reason}")]
pub struct UserError {
    /// The user's name.
    pub user: String,
    /// Why.
    pub reason: String,
}

impl BasicAuthUsers {
    /// Checks every entry: a name that basic authentication can carry, a bcrypt hash.
    pub fn new(users: BTreeMap<String, String>) -> Result<Self, UserError> {
        if users.is_empty() {
            return Err(UserError { user: String::new(), reason: "names no user".to_owned() });
        }
        for (user, hash) in &users {
            let refuse = |reason: &str| UserError { user: user.clone(), reason: reason.to_owned() };
            if user.is_empty() || user.contains(':') || user.chars().any(char::is_control) {
                return Err(refuse("a user name is not empty and has no ':' or control character"));
            }
            if hash.parse::<bcrypt::HashParts>().is_err() {
                return Err(refuse("is not a bcrypt hash ($2y$10$... as `htpasswd -nBC 10 USER` writes it)"));
            }
        }
        Ok(Self { users, remembered: Mutex::new(HashSet::new()), verifying: Arc::new(Semaphore::new(1)) })
    }

    /// How many users there are.
    pub fn len(&self) -> usize {
        self.users.len()
    }

    /// Whether there are none (never: `new` refuses that).
    pub fn is_empty(&self) -> bool {
        self.users.is_empty()
    }

    /// Whether an `Authorization` header names a user and its password.
    pub async fn admits(&self, authorization: Option<&HeaderValue>) -> bool {
        let Some((user, password)) = authorization.and_then(credentials) else { return false };
        let (known, hash) = match self.users.get(&user) {
            Some(hash) => (true, hash.clone()),
            // Never empty (`new`): the first user's hash, refused whatever it says.
            None => (false, self.users.values().next().cloned().unwrap_or_default()),
        };
        let key = digest(&user, &hash, &password);
        if known && self.remembered.lock().map(|set| set.contains(&key)).unwrap_or(false) {
            return true;
        }
        let Ok(_turn) = self.verifying.clone().acquire_owned().await else { return false };
        let verified = tokio::task::spawn_blocking(move || bcrypt::verify(password.as_bytes(), &hash).unwrap_or(false))
            .await
            .unwrap_or(false);
        if known && verified {
            if let Ok(mut set) = self.remembered.lock() {
                if set.len() >= REMEMBERED {
                    set.clear();
                }
                set.insert(key);
            }
        }
        known && verified
    }
}

fn digest(user: &str, hash: &str, password: &str) -> [u8; 32] {
    let mut sha = Sha256::new();
    for part in [user, hash, password] {
        sha.update((part.len() as u64).to_be_bytes());
        sha.update(part.as_bytes());
    }
    sha.finalize().into()
}

/// `Basic base64(user:password)` (RFC 7617), the scheme's name in any case.
fn credentials(header: &HeaderValue) -> Option<(String, String)> {
    let value = header.to_str().ok()?;
    let (scheme, encoded) = value.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    use base64::Engine as _;
    let decoded = base64::engine::general_purpose::STANDARD.decode(encoded.trim()).ok()?;
    let text = String::from_utf8(decoded).ok()?;
    let (user, password) = text.split_once(':')?;
    Some((user.to_owned(), password.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(user: &str, password: &str) -> HeaderValue {
        use base64::Engine as _;
        let encoded = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
        HeaderValue::from_str(&format!("Basic {encoded}")).unwrap()
    }

    fn users() -> BasicAuthUsers {
        let hash = bcrypt::hash("s3cret", 4).unwrap();
        BasicAuthUsers::new(BTreeMap::from([("prometheus".to_owned(), hash)])).unwrap()
    }

    #[tokio::test]
    async fn only_the_right_password_of_a_known_user_is_admitted() {
        let users = users();
        assert!(users.admits(Some(&header("prometheus", "s3cret"))).await);
        // Remembered, and still right.
        assert!(users.admits(Some(&header("prometheus", "s3cret"))).await);
        assert!(!users.admits(Some(&header("prometheus", "wrong"))).await);
        // An unknown user with a known user's password: checked against that user's
        // hash, refused all the same.
        assert!(!users.admits(Some(&header("nobody", "s3cret"))).await);
        assert!(!users.admits(None).await);
        assert!(!users.admits(Some(&HeaderValue::from_static("Bearer s3cret"))).await);
        assert!(!users.admits(Some(&HeaderValue::from_static("Basic !!!"))).await);
        assert!(
            users
                .admits(Some(
                    &HeaderValue::from_str(&header("prometheus", "s3cret").to_str().unwrap().replace("Basic", "basic"))
                        .unwrap()
                ))
                .await
        );
    }

    #[test]
    fn entries_that_cannot_work_are_refused_by_user() {
        let refuse = |user: &str, hash: &str| {
            BasicAuthUsers::new(BTreeMap::from([(user.to_owned(), hash.to_owned())])).unwrap_err().to_string()
        };
        let hash = bcrypt::hash("x", 4).unwrap();
        assert!(refuse("a:b", &hash).starts_with("basic_auth_users.a:b: "));

        assert!(refuse("admin", "plaintext").contains("basic_auth_users.admin: is not a bcrypt hash"));
    }
}
