//! Integers written in ASCII decimal straight into a wire buffer, without going through `fmt`:
//! NSQ's FIN/REQ/RDY, Memcached's write headers and the lengths in Redis's commands are on the
//! hot path.

use bytes::BufMut;

/// Writes `n` in decimal.
pub(crate) fn put_decimal(dst: &mut impl BufMut, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    dst.put_slice(&digits[i..]);
}

#[cfg(test)]
mod tests {
    use super::put_decimal;

    #[test]
    fn writes_every_digit() {
        for n in [0, 7, 10, 1_234_567, u64::MAX] {
            let mut out = Vec::new();
            put_decimal(&mut out, n);
            assert_eq!(out, n.to_string().as_bytes());
        }
    }
}
