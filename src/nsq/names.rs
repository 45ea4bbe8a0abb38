//! nsqd's rule for topic and channel names, written once for the consumer, the producer
//! and the configuration.

/// nsqd's rule for topic and channel names.
pub(crate) fn is_valid_name(name: &str) -> bool {
    let base = name.strip_suffix("#ephemeral").unwrap_or(name);
    !name.is_empty()
        && name.len() <= 64
        && !base.is_empty()
        && base
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_nsqd_rules() {
        assert!(is_valid_name("a.b_c-1"));
        assert!(is_valid_name("ch#ephemeral"));
        assert!(!is_valid_name("#ephemeral"));
        assert!(!is_valid_name(""));
        assert!(!is_valid_name("a b"));
        assert!(!is_valid_name("a\nCLS"));
        assert!(!is_valid_name(&"x".repeat(65)));
    }
}
