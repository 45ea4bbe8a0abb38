//! The table file's header: its 4096 bytes encoded and parsed (the format is described in
//! the docs of `table_file`).

use xxhash_rust::xxh3::xxh3_64;

use super::{JournalTag, HEADER_BYTES};
use crate::dedup::table::MAX_PREVIOUS;

const MAGIC: &[u8; 8] = b"NSQDDTBL";
/// The version written for a table mid-resize; one of one generation is written as version 1.
const FORMAT_VERSION: u32 = 2;
const MAX_IDENTITY: usize = 1024;
/// Where the header names the journal that follows the snapshot.
const JOURNAL_AT: usize = 3072;
/// Where a version-2 header describes the previous generations.
const GENERATIONS_AT: usize = 2048;

/// What a table file's header says.
pub(super) struct Header {
    pub(super) layout: u32,
    pub(super) sets: u64,
    pub(super) ways: u32,
    pub(super) slot_checksum: u64,
    pub(super) written_at: u64,
    pub(super) identity: String,
    pub(super) journal: Option<JournalTag>,
    /// The previous generations' shapes (sets, ways), newest first; empty in version 1.
    pub(super) previous: Vec<(u64, u32)>,
    /// When the resize happened (seconds since the Unix epoch); 0 without previous ones.
    pub(super) resized_at_s: u64,
    /// New entries the current generation took since.
    pub(super) inserts: u64,
}

impl Header {
    pub(super) fn encode(&self) -> Vec<u8> {
        let mut bytes = vec![0u8; HEADER_BYTES];
        bytes[0..8].copy_from_slice(MAGIC);
        // A table of one generation is written as version 1, which earlier versions read.
        let version = if self.previous.is_empty() {
            1
        } else {
            FORMAT_VERSION
        };
        bytes[8..12].copy_from_slice(&version.to_le_bytes());
        bytes[12..16].copy_from_slice(&self.layout.to_le_bytes());
        bytes[16..24].copy_from_slice(&self.sets.to_le_bytes());
        bytes[24..28].copy_from_slice(&self.ways.to_le_bytes());
        bytes[32..40].copy_from_slice(&self.slot_checksum.to_le_bytes());
        bytes[40..48].copy_from_slice(&self.written_at.to_le_bytes());
        let identity = &self.identity.as_bytes()[..self.identity.len().min(MAX_IDENTITY)];
        bytes[48..50].copy_from_slice(&(identity.len() as u16).to_le_bytes());
        bytes[50..50 + identity.len()].copy_from_slice(identity);
        if let Some(tag) = self.journal {
            bytes[JOURNAL_AT..JOURNAL_AT + 8].copy_from_slice(&tag.life.to_le_bytes());
            bytes[JOURNAL_AT + 8..JOURNAL_AT + 12].copy_from_slice(&tag.generation.to_le_bytes());
        }
        if !self.previous.is_empty() {
            let at = GENERATIONS_AT;
            bytes[at..at + 4].copy_from_slice(&(self.previous.len() as u32).to_le_bytes());
            bytes[at + 8..at + 16].copy_from_slice(&self.resized_at_s.to_le_bytes());
            bytes[at + 16..at + 24].copy_from_slice(&self.inserts.to_le_bytes());
            for (i, (sets, ways)) in self.previous.iter().enumerate() {
                let shape = at + 24 + 16 * i;
                bytes[shape..shape + 8].copy_from_slice(&sets.to_le_bytes());
                bytes[shape + 8..shape + 12].copy_from_slice(&ways.to_le_bytes());
            }
        }
        let checksum = xxh3_64(&bytes[..HEADER_BYTES - 8]);
        bytes[HEADER_BYTES - 8..].copy_from_slice(&checksum.to_le_bytes());
        bytes
    }

    pub(super) fn parse(bytes: &[u8]) -> Result<Header, String> {
        let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4"));
        let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8"));
        if &bytes[0..8] != MAGIC {
            return Err("it is not an nsq-dedupe table file (wrong magic)".into());
        }
        if xxh3_64(&bytes[..HEADER_BYTES - 8]) != u64_at(HEADER_BYTES - 8) {
            return Err("its header does not match its checksum".into());
        }
        let version = u32_at(8);
        if version != 1 && version != FORMAT_VERSION {
            return Err(format!(
                "format version {version}; this version of nsq-dedupe reads 1 and {FORMAT_VERSION}"
            ));
        }
        let previous_count = if version == 1 {
            0
        } else {
            u32_at(GENERATIONS_AT) as usize
        };
        if previous_count > MAX_PREVIOUS {
            return Err(format!(
                "its header names {previous_count} previous generations (at most {MAX_PREVIOUS})"
            ));
        }
        let previous = (0..previous_count)
            .map(|i| {
                let shape = GENERATIONS_AT + 24 + 16 * i;
                (u64_at(shape), u32_at(shape + 8))
            })
            .collect();
        let len = usize::from(u16::from_le_bytes([bytes[48], bytes[49]]));
        if len > MAX_IDENTITY {
            return Err("its digest identity is too long".into());
        }
        Ok(Header {
            layout: u32_at(12),
            sets: u64_at(16),
            ways: u32_at(24),
            slot_checksum: u64_at(32),
            written_at: u64_at(40),
            identity: String::from_utf8_lossy(&bytes[50..50 + len]).into_owned(),
            journal: match u64_at(JOURNAL_AT) {
                0 => None,
                life => Some(JournalTag {
                    life,
                    generation: u32_at(JOURNAL_AT + 8),
                }),
            },
            previous,
            resized_at_s: if version == 1 {
                0
            } else {
                u64_at(GENERATIONS_AT + 8)
            },
            inserts: if version == 1 {
                0
            } else {
                u64_at(GENERATIONS_AT + 16)
            },
        })
    }
}
