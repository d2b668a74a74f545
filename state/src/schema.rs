//! The on-disk schema version and the migrations between versions.
//!
//! The [`Tree::Meta`] key [`SCHEMA_KEY`] holds the version as a decimal string. A store
//! written by a newer dipamd is refused (its records may mean something this build does not
//! know); an older one is migrated forward one step at a time, each step in one atomic commit.

use std::path::Path;

use crate::{Batch, Store, StoreError, Tree};

/// The schema version this build reads and writes.
pub const SCHEMA_VERSION: u32 = 1;

/// The [`Tree::Meta`] key that holds the schema version.
pub const SCHEMA_KEY: &[u8] = b"schema_version";

/// Checks the schema version of `store` (opened from `path`, used in error messages) and
/// brings it to [`SCHEMA_VERSION`]: a fresh store gets the version written, an older one is
/// migrated, a newer one is refused with [`StoreError::SchemaTooNew`].
pub fn ensure_schema<S: Store + ?Sized>(store: &S, path: &Path) -> Result<(), StoreError> {
    let mut version = match read_version(store, path)? {
        Some(v) => v,
        None => {
            // No version but records present means the meta tree was lost, not that the store
            // is new: treating it as fresh would silently bless whatever survived.
            let records: usize = Tree::ALL
                .iter()
                .filter(|t| **t != Tree::Meta)
                .map(|t| store.len(*t))
                .sum::<Result<usize, _>>()?;
            if records > 0 {
                return Err(StoreError::Corrupt {
                    path: path.to_path_buf(),
                    detail: format!(
                        "no schema version recorded, yet the store holds {records} records"
                    ),
                });
            }
            let mut batch = Batch::new();
            batch.put(Tree::Meta, SCHEMA_KEY, SCHEMA_VERSION.to_string());
            store.commit(batch)?;
            return Ok(());
        }
    };
    if version > SCHEMA_VERSION {
        return Err(StoreError::SchemaTooNew {
            path: path.to_path_buf(),
            found: version,
            supported: SCHEMA_VERSION,
        });
    }
    while version < SCHEMA_VERSION {
        version = migrate(store, path, version)?;
    }
    Ok(())
}

fn read_version<S: Store + ?Sized>(store: &S, path: &Path) -> Result<Option<u32>, StoreError> {
    let Some(raw) = store.get(Tree::Meta, SCHEMA_KEY)? else {
        return Ok(None);
    };
    std::str::from_utf8(&raw)
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
        .map(Some)
        .ok_or_else(|| StoreError::Corrupt {
            path: path.to_path_buf(),
            detail: format!(
                "schema version {:?} is not a number",
                raw.escape_ascii().to_string()
            ),
        })
}

/// Migrates the store from schema `from` to the next version and returns that version.
///
/// Each arm must rewrite what changed *and* the new [`SCHEMA_KEY`] in one [`Batch`], so a crash
/// mid-migration leaves either the old or the new schema, never a mix. To add version N+1:
/// bump [`SCHEMA_VERSION`] and add an arm `N => { ...; Ok(N + 1) }`.
fn migrate<S: Store + ?Sized>(store: &S, path: &Path, from: u32) -> Result<u32, StoreError> {
    // `store` is unused until the first real migration exists.
    let _ = store;
    match from {
        // Version 1 is the first format; no dipamd ever wrote version 0.
        0 => Err(StoreError::Corrupt {
            path: path.to_path_buf(),
            detail: "schema version 0 predates every dipamd release; no migration exists".into(),
        }),
        // New migrations go above this arm, e.g. `1 => { ...; Ok(2) }`.
        other => Err(StoreError::Backend(format!(
            "no migration from schema version {other} to {SCHEMA_VERSION}"
        ))),
    }
}
