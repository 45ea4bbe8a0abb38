//! The journal's file: its header, the 24-byte record and its check, the generation a
//! place belongs to, making a new file, and replaying an old one onto a table (the format is
//! in `journal.rs`).

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::Path;

use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

use crate::dedup::table::Table;
use crate::dedup::table_file::{open_regular, TableFileError};
use crate::dedup::Digest;

const MAGIC: &[u8; 8] = b"NSQDDJNL";
const FORMAT_VERSION: u32 = 1;
pub(super) const HEADER_BYTES: usize = 4096;
pub(super) const RECORD_WORDS: usize = 3;
pub(super) const RECORD_BYTES: usize = RECORD_WORDS * 8;
/// Records per half: the table's slots, within these bounds. A half as large as the table
/// holds, in records, about three times the bytes of a snapshot.
pub(super) const MIN_CAPACITY: u64 = 1 << 16;
pub(super) const MAX_CAPACITY: u64 = 1 << 24;

/// What a record says happened to its digest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Commit = 0,
    Erase = 1,
}

pub(super) fn pack(generation: u32, place: u32) -> u64 {
    (u64::from(generation) << 32) | u64::from(place)
}

pub(super) fn unpack(state: u64) -> (u32, u32) {
    ((state >> 32) as u32, state as u32)
}

/// The generation after `generation`; 0 is never one, so an all-zero record never matches.
pub(super) fn next(generation: u32) -> u32 {
    generation.wrapping_add(1).max(1)
}

pub(super) fn tag(hi: u64, lo: u64, generation: u32, kind: Kind) -> u64 {
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(&hi.to_le_bytes());
    bytes[8..].copy_from_slice(&lo.to_le_bytes());
    let seed = (u64::from(generation) << 1) | kind as u64;
    let check = xxh3_64_with_seed(&bytes, seed) & 0x7fff_ffff;
    (u64::from(generation) << 32) | ((kind as u64) << 31) | check
}

pub(super) struct Header {
    pub(super) life: u64,
    pub(super) capacity: u64,
}

/// The header of an existing journal, or why it is not one this version can use.
pub(super) fn read_header(file: &mut File) -> io::Result<Result<Header, String>> {
    let mut bytes = vec![0u8; HEADER_BYTES];
    let mut read = 0;
    while read < HEADER_BYTES {
        match file.read(&mut bytes[read..])? {
            0 => return Ok(Err(format!("it is {read} bytes, shorter than its header"))),
            n => read += n,
        }
    }
    let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4"));
    let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8"));
    if &bytes[..8] != MAGIC || xxh3_64(&bytes[..HEADER_BYTES - 8]) != u64_at(HEADER_BYTES - 8) {
        return Ok(Err("its header is damaged".into()));
    }
    if u32_at(8) != FORMAT_VERSION || u32_at(12) as usize != RECORD_BYTES {
        return Ok(Err(format!(
            "it is format version {} (this version reads {FORMAT_VERSION})",
            u32_at(8)
        )));
    }
    let capacity = u64_at(24);
    if !(1..=MAX_CAPACITY).contains(&capacity) {
        return Ok(Err(format!("its header names {capacity} records per half")));
    }
    Ok(Ok(Header {
        life: u64_at(16),
        capacity,
    }))
}

/// A new journal file for `life` (any old one is replaced), synced with its directory.
pub(super) fn create(path: &Path, life: u64, capacity: u64) -> Result<File, TableFileError> {
    let io = |cause| TableFileError::Io {
        path: path.to_owned(),
        cause,
    };
    let mut file = open_regular(
        path,
        OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true),
    )
    .map_err(|e| e.at(path))?;
    write_header(&mut file, path, life, capacity).map_err(io)?;
    Ok(file)
}

fn write_header(file: &mut File, path: &Path, life: u64, capacity: u64) -> io::Result<()> {
    let mut header = vec![0u8; HEADER_BYTES];
    header[..8].copy_from_slice(MAGIC);
    header[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    header[12..16].copy_from_slice(&(RECORD_BYTES as u32).to_le_bytes());
    header[16..24].copy_from_slice(&life.to_le_bytes());
    header[24..32].copy_from_slice(&capacity.to_le_bytes());
    let checksum = xxh3_64(&header[..HEADER_BYTES - 8]);
    header[HEADER_BYTES - 8..].copy_from_slice(&checksum.to_le_bytes());
    file.write_all(&header)?;
    // The records are a hole until written: the file takes disk space as it is used.
    file.set_len((HEADER_BYTES + 2 * capacity as usize * RECORD_BYTES) as u64)?;
    file.sync_all()?;
    if let Some(dir) = path.parent() {
        let dir = if dir.as_os_str().is_empty() {
            Path::new(".")
        } else {
            dir
        };
        File::open(dir)?.sync_all()?;
    }
    Ok(())
}

/// A life no other journal has had: the clock, the process and an address, hashed.
pub(super) fn new_life() -> u64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    let local = 0u8;
    let mut bytes = Vec::with_capacity(32);
    bytes.extend_from_slice(&now.to_le_bytes());
    bytes.extend_from_slice(&std::process::id().to_le_bytes());
    bytes.extend_from_slice(&(std::ptr::addr_of!(local) as usize).to_le_bytes());
    xxh3_64(&bytes).max(1)
}

#[derive(Default)]
pub(super) struct Replayed {
    pub(super) commits: u64,
    pub(super) erases: u64,
}

/// Applies the records of generation `first` (its half), then of the next generation (the
/// other half), each half in order, onto `table`.
pub(super) fn replay(
    file: &mut File,
    header: &Header,
    first: u32,
    table: &Table,
) -> io::Result<Replayed> {
    let mut replayed = Replayed::default();
    let half_bytes = header.capacity as usize * RECORD_BYTES;
    let mut buf = vec![0u8; (1 << 20) * RECORD_BYTES];
    for generation in [first, next(first)] {
        let start = HEADER_BYTES + (generation % 2) as usize * half_bytes;
        let mut file = &*file;
        std::io::Seek::seek(&mut file, io::SeekFrom::Start(start as u64))?;
        let mut left = half_bytes;
        while left > 0 {
            let want = left.min(buf.len());
            // A short file (truncated) ends the half: what is missing was never there.
            let got = read_full(&mut file, &mut buf[..want])?;
            for record in buf[..got - got % RECORD_BYTES].chunks_exact(RECORD_BYTES) {
                let word = |i: usize| {
                    u64::from_le_bytes(record[i * 8..i * 8 + 8].try_into().expect("8 bytes"))
                };
                let (hi, lo, stored) = (word(0), word(1), word(2));
                if (stored >> 32) as u32 != generation {
                    continue;
                }
                let kind = if (stored >> 31) & 1 == 1 {
                    Kind::Erase
                } else {
                    Kind::Commit
                };
                if tag(hi, lo, generation, kind) != stored {
                    continue;
                }
                let digest = Digest::from_u128((u128::from(hi) << 64) | u128::from(lo));
                match kind {
                    Kind::Commit => {
                        table.contains_and_add(digest);
                        replayed.commits += 1;
                    }
                    Kind::Erase => {
                        table.erase(digest);
                        replayed.erases += 1;
                    }
                }
            }
            if got < want {
                break;
            }
            left -= want;
        }
    }
    Ok(replayed)
}

fn read_full(file: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match file.read(&mut buf[got..])? {
            0 => break,
            n => got += n,
        }
    }
    Ok(got)
}
