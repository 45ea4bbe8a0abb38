//! Redis Cluster's key-to-slot mapping (CRC16 of the key, or of its `{hash tag}`, modulo
//! 16384) and the map from slots to the master that serves them, read from `CLUSTER SLOTS`.

use redis::Value;

/// Slots of a Redis Cluster.
pub(super) const SLOTS: usize = 16_384;

/// The slot of `key`, as Redis Cluster computes it: CRC16 (XMODEM) of the key, or of the part
/// between the first `{` and the next `}` when that part is not empty.
pub(super) fn key_slot(key: &[u8]) -> u16 {
    let hashed = match key.iter().position(|&b| b == b'{') {
        Some(open) => match key[open + 1..].iter().position(|&b| b == b'}') {
            Some(len) if len > 0 => &key[open + 1..open + 1 + len],
            _ => key,
        },
        None => key,
    };
    crc16_xmodem(hashed) % SLOTS as u16
}

fn crc16_xmodem(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in bytes {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// Which master serves each slot, as `host:port`; `None` where unknown.
#[derive(Debug, Clone)]
pub(super) struct SlotMap {
    masters: Vec<Option<String>>,
}

impl Default for SlotMap {
    fn default() -> Self {
        SlotMap {
            masters: vec![None; SLOTS],
        }
    }
}

impl SlotMap {
    /// The master of `slot`, if known.
    pub(super) fn master(&self, slot: u16) -> Option<&str> {
        self.masters.get(usize::from(slot))?.as_deref()
    }

    /// Records what a `MOVED` answer said: `slot` is served by `addr` now.
    pub(super) fn moved(&mut self, slot: u16, addr: &str) {
        if let Some(entry) = self.masters.get_mut(usize::from(slot)) {
            *entry = Some(addr.to_owned());
        }
    }

    /// Every master in the map, once each.
    pub(super) fn all_masters(&self) -> Vec<String> {
        let mut masters: Vec<String> = self.masters.iter().flatten().cloned().collect();
        masters.sort_unstable();
        masters.dedup();
        masters
    }

    /// Reads a `CLUSTER SLOTS` answer given by the node at `asked_host` (whose host an empty
    /// or `?` host name stands for).
    ///
    /// # Errors
    ///
    /// A description of what did not parse.
    pub(super) fn from_cluster_slots(value: &Value, asked_host: &str) -> Result<Self, String> {
        let Value::Array(ranges) = value else {
            return Err(format!("CLUSTER SLOTS answered {value:?}"));
        };
        let mut map = SlotMap::default();
        for range in ranges {
            let Value::Array(fields) = range else {
                return Err(format!("a CLUSTER SLOTS range is {range:?}"));
            };
            let (Some(Value::Int(start)), Some(Value::Int(end)), Some(Value::Array(master))) =
                (fields.first(), fields.get(1), fields.get(2))
            else {
                return Err(format!("a CLUSTER SLOTS range is {fields:?}"));
            };
            let host = match master.first() {
                Some(Value::BulkString(host)) => String::from_utf8_lossy(host).into_owned(),
                Some(Value::SimpleString(host)) => host.clone(),
                _ => String::new(),
            };
            let host = if host.is_empty() || host == "?" {
                asked_host.to_owned()
            } else {
                host
            };
            let Some(Value::Int(port)) = master.get(1) else {
                return Err(format!("a CLUSTER SLOTS master is {master:?}"));
            };
            let addr = format!("{host}:{port}");
            let (start, end) = (usize::try_from(*start), usize::try_from(*end));
            let (Ok(start), Ok(end)) = (start, end) else {
                return Err("a CLUSTER SLOTS range is negative".into());
            };
            for slot in start..=end.min(SLOTS - 1) {
                map.masters[slot] = Some(addr.clone());
            }
        }
        Ok(map)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_match_redis_cluster() {
        // Values from the Redis Cluster specification and `CLUSTER KEYSLOT`.
        assert_eq!(crc16_xmodem(b"123456789"), 0x31C3);
        assert_eq!(key_slot(b"foo"), 12_182);
        assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"user1000"));
        assert_eq!(key_slot(b"foo{}{bar}"), key_slot(b"foo{}{bar}"));
        assert_eq!(key_slot(b"foo{{bar}}zap"), key_slot(b"{bar"));
    }

    #[test]
    fn cluster_slots_answer_is_read() {
        let int = Value::Int;
        let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let answer = Value::Array(vec![
            Value::Array(vec![
                int(0),
                int(5460),
                Value::Array(vec![bulk("10.0.0.1"), int(7000), bulk("id1")]),
                Value::Array(vec![bulk("10.0.0.4"), int(7003), bulk("id4")]),
            ]),
            Value::Array(vec![
                int(5461),
                int(16383),
                Value::Array(vec![bulk(""), int(7001), bulk("id2")]),
            ]),
        ]);
        let map = SlotMap::from_cluster_slots(&answer, "10.0.0.9").unwrap();
        assert_eq!(map.master(0), Some("10.0.0.1:7000"));
        assert_eq!(map.master(5460), Some("10.0.0.1:7000"));
        assert_eq!(map.master(5461), Some("10.0.0.9:7001"));
        assert_eq!(map.all_masters(), ["10.0.0.1:7000", "10.0.0.9:7001"]);
        assert!(SlotMap::from_cluster_slots(&int(3), "h").is_err());
    }
}
