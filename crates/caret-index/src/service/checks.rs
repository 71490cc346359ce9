//! Checks of what a request names: workspace ids, obfuscated paths, hex ids, file records.

use caret_protocol::{ChunkMeta, FileMeta};
use caret_store::{ChunkRef, FileRecord};

use crate::{Error, Result};

pub(super) fn is_valid_id(id: &str) -> bool {
    (1..=64).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
}

pub(super) fn check_id(id: &str) -> Result<()> {
    if is_valid_id(id) {
        Ok(())
    } else {
        Err(Error::BadRequest("a workspace id is 1-64 characters of a-z and 0-9".into()))
    }
}

/// Obfuscated paths: `/`-separated segments of 1-64 characters of a-z and 0-9.
pub(super) fn check_path(path: &str, allow_root: bool) -> Result<()> {
    if path.is_empty() && allow_root {
        return Ok(());
    }
    let ok = path.len() <= 8192 && path.split('/').all(is_valid_id);
    if ok {
        Ok(())
    } else {
        Err(Error::BadRequest("paths must be obfuscated: segments of a-z and 0-9 separated by /".into()))
    }
}

pub(super) fn hex32(s: &str, what: &str) -> Result<[u8; 32]> {
    let bytes = s.as_bytes();
    if bytes.len() != 64 {
        return Err(Error::BadRequest(format!("{what} must be 64 hex characters")));
    }
    let mut out = [0u8; 32];
    for (i, pair) in bytes.chunks(2).enumerate() {
        let s = std::str::from_utf8(pair).map_err(|_| Error::BadRequest(format!("{what} is not hex")))?;
        out[i] = u8::from_str_radix(s, 16).map_err(|_| Error::BadRequest(format!("{what} is not hex")))?;
    }
    Ok(out)
}

pub(super) fn file_record(f: &FileMeta) -> Result<FileRecord> {
    check_path(&f.path, false)?;
    let chunks = f
        .chunks
        .iter()
        .map(|c: &ChunkMeta| {
            if c.language.len() > 32 || c.kind.len() > 16 {
                return Err(Error::BadRequest("chunk language or kind is too long".into()));
            }
            Ok(ChunkRef {
                id: hex32(&c.id, "chunk id")?,
                start_line: c.start_line,
                end_line: c.end_line,
                language: c.language.clone(),
                kind: c.kind.clone(),
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(FileRecord { path: f.path.clone(), leaf: hex32(&f.leaf, "leaf")?, chunks })
}
