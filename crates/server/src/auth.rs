//! Who may do what, and who did (§ security in the README): API tokens with roles, kept in
//! the store as hashes, and the append-only audit trail.
//!
//! A token is 256 bits from the operating system's generator, shown once when created; the
//! store keeps its SHA-256. A presented token is hashed and compared with every stored hash
//! in constant time, so neither a lookup nor a comparison tells an attacker how close a guess
//! came. Every token is read from the store on each request: a revocation holds at once.

use durafiber_api::Timestamp;
use std::{
    fmt,
    path::{Path, PathBuf},
    str::FromStr,
};

use durafiber_runtime::sha256_hex;
use durafiber_store::{
    Batch, Durability, Store, StoreError,
    access::{self, TokenRecord},
    tables::keys,
};
use serde::Serialize;
use subtle::ConstantTimeEq;

/// What a token may do; each role may do everything the ones before it may.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Reads: runs, approvals, alarms, storage, metrics, events.
    Reader,
    /// A reader who also decides approvals.
    Reviewer,
    /// A reviewer who also starts and cancels runs, sends messages, requests and events,
    /// and sets and cancels alarms.
    Operator,
    /// Everything: tokens, the audit trail, backups.
    Admin,
}

impl Role {
    /// The role's name.
    pub fn name(self) -> &'static str {
        match self {
            Role::Reader => "reader",
            Role::Reviewer => "reviewer",
            Role::Operator => "operator",
            Role::Admin => "admin",
        }
    }

    /// The role's name with its article, as a sentence says it: "an operator", "a reader".
    pub fn with_article(self) -> &'static str {
        match self {
            Role::Reader => "a reader",
            Role::Reviewer => "a reviewer",
            Role::Operator => "an operator",
            Role::Admin => "an admin",
        }
    }
}

impl Caller {
    /// The caller as a decider of approvals: their name, and every role theirs includes.
    pub fn decider(&self) -> durafiber_runtime::Decider {
        let roles: Vec<&str> = [Role::Reader, Role::Reviewer, Role::Operator, Role::Admin]
            .into_iter()
            .filter(|r| *r <= self.role)
            .map(Role::name)
            .collect();
        durafiber_runtime::Decider::new(self.name.clone(), &roles)
    }
}

impl FromStr for Role {
    type Err = AccessError;
    fn from_str(s: &str) -> Result<Self, AccessError> {
        match s {
            "reader" => Ok(Role::Reader),
            "reviewer" => Ok(Role::Reviewer),
            "operator" => Ok(Role::Operator),
            "admin" => Ok(Role::Admin),
            other => Err(AccessError::Invalid(format!(
                "unknown role {other:?} (reader, reviewer, operator, admin)"
            ))),
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Who is asking: the name and role of the token presented.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// The token's name.
    pub name: String,
    /// Its role.
    pub role: Role,
}

/// Why a token or audit operation failed.
#[derive(Debug, thiserror::Error)]
pub enum AccessError {
    /// A bad name or role.
    #[error("{0}")]
    Invalid(String),
    /// A token of that name exists.
    #[error("a token named {0:?} exists; revoke it first or pick another name")]
    NameTaken(String),
    /// Revoking it would leave no admin token: nobody could manage tokens any more.
    #[error("token {0:?} is the last admin token: create another admin token before revoking it")]
    LastAdmin(String),
    /// The operating system gave no randomness.
    #[error("no randomness for a token: {0}")]
    Random(String),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The admin token file could not be written.
    #[error("writing {path}: {source}")]
    File {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// Where `serve` writes the first admin token, inside the data directory.
pub const ADMIN_TOKEN_FILE: &str = "admin.token";

/// Longest token name.
const TOKEN_NAME_MAX: usize = 64;

fn check_name(name: &str) -> Result<(), AccessError> {
    let ok = !name.is_empty()
        && name.len() <= TOKEN_NAME_MAX
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(AccessError::Invalid(format!(
            "a token name is 1–{TOKEN_NAME_MAX} letters, digits, '-', '_' or '.', not {name:?}"
        )))
    }
}

/// 256 bits from the operating system's generator, as 64 hex digits.
pub fn random_hex() -> Result<String, AccessError> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| AccessError::Random(e.to_string()))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// A new token: `dft_` and 256 bits as 64 hex digits.
fn new_token() -> Result<String, AccessError> {
    Ok(format!("dft_{}", random_hex()?))
}

/// Creates a token; returns it (the only time it is shown).
pub async fn create(store: &Store, name: &str, role: Role, now: Timestamp) -> Result<String, AccessError> {
    check_name(name)?;
    let token = new_token()?;
    insert(store, name, role, &token, now).await?;
    Ok(token)
}

/// Stores `token`'s record under `name`.
async fn insert(
    store: &Store,
    name: &str,
    role: Role,
    token: &str,
    now: Timestamp,
) -> Result<(), AccessError> {
    let record = TokenRecord {
        name: name.to_string(),
        role: role.name().into(),
        hash: sha256_hex(token.as_bytes()),
        created_at_ms: now,
    };
    // An insert, not a put: two nodes sharing a store that create the same name at once
    // must not both believe they did (the second would hold a token that no longer works).
    let mut batch = Batch::new();
    batch.insert(keys::token(name), &record)?;
    match store.commit(batch, Durability::Sync).await {
        Ok(()) => Ok(()),
        Err(StoreError::Exists { .. }) => Err(AccessError::NameTaken(name.to_string())),
        Err(e) => Err(e.into()),
    }
}

/// Every token's record (hashes, never tokens), by name.
pub fn list(store: &Store) -> Result<Vec<TokenRecord>, AccessError> {
    let mut out = Vec::new();
    for (_, record) in store.scan::<TokenRecord>(&keys::TOKENS.all(), None, usize::MAX)? {
        out.push(record?);
    }
    Ok(out)
}

/// Every token as shown to an admin: name, role, creation time — never its hash.
pub fn shown(store: &Store) -> Result<Vec<serde_json::Value>, AccessError> {
    Ok(list(store)?
        .into_iter()
        .map(|t| serde_json::json!({"name": t.name, "role": t.role, "created_at_ms": t.created_at_ms}))
        .collect())
}

/// Revokes the token called `name`; false when there was none.
pub async fn revoke(store: &Store, name: &str) -> Result<bool, AccessError> {
    check_name(name)?;
    let key = keys::token(name);
    let Some(token) = store.get::<TokenRecord>(&key)? else {
        return Ok(false);
    };
    if token.role == Role::Admin.name() {
        let admins = list(store)?.into_iter().filter(|t| t.role == Role::Admin.name()).count();
        if admins <= 1 {
            return Err(AccessError::LastAdmin(name.to_string()));
        }
    }
    let mut batch = Batch::new();
    batch.delete(key);
    store.commit(batch, Durability::Sync).await?;
    Ok(true)
}

/// The caller a presented token stands for, or `None` for no valid token.
pub fn verify(store: &Store, token: &str) -> Result<Option<Caller>, AccessError> {
    let presented = sha256_hex(token.as_bytes());
    let mut found = None;
    for record in list(store)? {
        // Every record is compared, and in constant time: the time taken says nothing.
        if bool::from(presented.as_bytes().ct_eq(record.hash.as_bytes())) {
            found = Some(record);
        }
    }
    Ok(match found {
        Some(record) => Some(Caller { name: record.name, role: record.role.parse()? }),
        None => None,
    })
}

/// The caller of the token called `name` while its hash is still `hash`; `None` once it was
/// revoked (or revoked and created again: a new token under the old name is another token).
pub fn still_valid(store: &Store, name: &str, hash: &str) -> Result<Option<Caller>, AccessError> {
    let key = keys::token(name);
    match store.get::<TokenRecord>(&key)? {
        Some(record) if bool::from(record.hash.as_bytes().ct_eq(hash.as_bytes())) => {
            Ok(Some(Caller { name: record.name, role: record.role.parse()? }))
        }
        _ => Ok(None),
    }
}

/// What [`bootstrap`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Bootstrap {
    /// The store had no token: this node created the `admin` token and wrote it here.
    Created(PathBuf),
    /// The store has tokens already, made earlier or by another node sharing it (even one
    /// that started at the same instant): this node wrote no file.
    Existing,
    /// The store has tokens already, and the `admin.token` here held none of them: a start
    /// killed between writing the file and committing its record, on a store another node
    /// made its admin in since. The file was removed.
    StaleFileRemoved(PathBuf),
}

/// On a store with no token at all: creates the `admin` token and writes it to
/// `DATA/admin.token`, readable by its owner only. Of several nodes that start together on
/// a fresh database, exactly one does; the others find it made.
///
/// The file is durable before the token's record is committed, so a start killed at any
/// moment leaves either no record (the next start mints the admin again and writes the file
/// anew) or a record whose token is in the file. Never a record whose token nobody has.
pub async fn bootstrap(store: &Store, data: &Path, now: Timestamp) -> Result<Bootstrap, AccessError> {
    let path = data.join(ADMIN_TOKEN_FILE);
    if !list(store)?.is_empty() {
        return match read_admin_token(data) {
            Some(token) if verify(store, &token)?.is_none() => {
                remove_file(&path)?;
                Ok(Bootstrap::StaleFileRemoved(path))
            }
            _ => Ok(Bootstrap::Existing),
        };
    }
    let token = new_token()?;
    write_private(&path, &token).map_err(|source| AccessError::File { path: path.clone(), source })?;
    match insert(store, "admin", Role::Admin, &token, now).await {
        Ok(()) => {}
        // Another node created it between the look and the insert: the file written here
        // holds a token that never worked.
        Err(AccessError::NameTaken(_)) => {
            remove_file(&path)?;
            return Ok(Bootstrap::Existing);
        }
        Err(e) => return Err(e),
    }
    access::append(store, "durafiber", "token_create", None, "admin (admin), written to admin.token", now)
        .await?;
    Ok(Bootstrap::Created(path))
}

/// Writes `token` to `path` (mode 0600) durably: the file, then its directory's entry.
fn write_private(path: &Path, token: &str) -> std::io::Result<()> {
    use std::{io::Write, os::unix::fs::OpenOptionsExt};
    let tmp = path.with_extension("token.tmp");
    let mut file =
        std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&tmp)?;
    file.write_all(format!("{token}\n").as_bytes())?;
    file.sync_all()?;
    std::fs::rename(&tmp, path)?;
    sync_parent(path)
}

/// Removes the admin token file (gone already is fine), durably.
fn remove_file(path: &Path) -> Result<(), AccessError> {
    let removed = match std::fs::remove_file(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        other => other,
    };
    removed.and_then(|()| sync_parent(path)).map_err(|source| AccessError::File { path: path.into(), source })
}

/// Makes a rename or removal in `path`'s directory durable.
fn sync_parent(path: &Path) -> std::io::Result<()> {
    match path.parent() {
        Some(dir) => std::fs::File::open(dir)?.sync_all(),
        None => Ok(()),
    }
}

/// The admin token `serve` wrote into `data`, when this user can read it.
pub fn read_admin_token(data: &Path) -> Option<String> {
    let text = std::fs::read_to_string(data.join(ADMIN_TOKEN_FILE)).ok()?;
    Some(text.trim().to_string()).filter(|t| !t.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_are_ordered_and_parse_back() {
        assert!(
            Role::Reader < Role::Reviewer && Role::Reviewer < Role::Operator && Role::Operator < Role::Admin
        );
        for role in [Role::Reader, Role::Reviewer, Role::Operator, Role::Admin] {
            assert_eq!(role.name().parse::<Role>().expect("parses"), role);
        }
        assert!("root".parse::<Role>().is_err());
    }

    #[test]
    fn names_are_checked_and_tokens_carry_256_bits() {
        assert!(check_name("ci-bot.1").is_ok());
        assert!(
            check_name("").is_err() && check_name("a b").is_err() && check_name(&"x".repeat(65)).is_err()
        );
        let token = new_token().expect("token");
        assert!(token.len() == 4 + 64 && token[4..].chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(token, new_token().expect("another"));
    }
}
