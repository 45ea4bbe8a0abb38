//! The receive low-water mark of a consumer's socket (Linux's `SO_RCVLOWAT`), raised while
//! its connection gathers the consumer's answers: a packet then no longer makes the socket
//! readable, so the consumer's FINs, one packet each, do not wake the endpoint one by one.
//! The mark stays raised from one gathering to the next, read by [`read_now`], which takes
//! what arrived whatever the mark (a read that does not wait returns what is there): two
//! `setsockopt` calls per connection while its consumer keeps it gathering, not two per
//! read. Lowering it again makes Linux report the socket readable at once if anything arrived
//! meanwhile (`tcp_set_rcvlowat` checks), and a closed connection is reported whatever the
//! mark. Elsewhere the mark is left alone: the gathering still reads many answers at once,
//! only the wake-ups stay.

use bytes::BytesMut;
use tokio::net::TcpStream;
use tokio_util::either::Either;

use super::Stream;

/// The mark while gathering: far above what a consumer answers in a gathering window (a
/// FIN is 21 bytes), and small enough that Linux does not enlarge the receive buffer for it.
#[cfg(target_os = "linux")]
const GATHERING: libc::c_int = 16 * 1024;

fn tcp(stream: &Stream) -> &TcpStream {
    match stream {
        Either::Left(tcp) => tcp,
        Either::Right(tls) => tls.get_ref().0,
    }
}

/// Raises the mark: arriving bytes no longer wake the connection.
pub(super) fn raise(stream: &Stream) {
    #[cfg(target_os = "linux")]
    set(tcp(stream), GATHERING);
    #[cfg(not(target_os = "linux"))]
    let _ = tcp(stream);
}

/// Lowers the mark to one byte, as it was: the connection is woken if anything waits.
pub(super) fn lower(stream: &Stream) {
    #[cfg(target_os = "linux")]
    set(tcp(stream), 1);
    #[cfg(not(target_os = "linux"))]
    let _ = tcp(stream);
}

/// Best effort: should the call fail, the connection is woken by each packet, as without it.
#[cfg(target_os = "linux")]
fn set(tcp: &TcpStream, bytes: libc::c_int) {
    use std::os::fd::AsRawFd;
    // SAFETY: the descriptor is the stream's, open for as long as the borrow; the value is a
    // c_int that lives through the call, passed with its own size.
    unsafe {
        libc::setsockopt(
            tcp.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVLOWAT,
            std::ptr::from_ref(&bytes).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
}

/// Appends to `input` what the consumer sent, without waiting and whatever the mark: the
/// bytes read (0: the consumer closed the connection), or `WouldBlock` when nothing came.
/// `None` for a TLS stream, whose records rustls reads only once the socket is reported
/// readable (the mark is then lowered, and the connection reads as usual), and off Linux.
pub(super) fn read_now(stream: &Stream, input: &mut BytesMut) -> Option<std::io::Result<usize>> {
    match stream {
        #[cfg(target_os = "linux")]
        Either::Left(tcp) => Some(recv_now(tcp, input)),
        _ => {
            let _ = input;
            None
        }
    }
}

/// A `recv` that does not wait: tokio's own reads wait for the readiness the raised mark
/// keeps from being reported.
#[cfg(target_os = "linux")]
fn recv_now(tcp: &TcpStream, input: &mut BytesMut) -> std::io::Result<usize> {
    use bytes::BufMut;
    use std::os::fd::AsRawFd;
    input.reserve(4096);
    let (buffer, room) = {
        let spare = input.spare_capacity_mut();
        (spare.as_mut_ptr(), spare.len())
    };
    loop {
        // SAFETY: the descriptor is the stream's, open for as long as the borrow; the buffer
        // is `input`'s spare capacity, valid for `room` bytes and untouched since, which
        // `recv` writes (never reads) and only up to the count it returns.
        let read =
            unsafe { libc::recv(tcp.as_raw_fd(), buffer.cast(), room, libc::MSG_DONTWAIT) };
        match usize::try_from(read) {
            Ok(read) => {
                // SAFETY: `recv` initialised the first `read` bytes of the spare capacity.
                unsafe { input.advance_mut(read) };
                return Ok(read);
            }
            Err(_) => {
                let error = std::io::Error::last_os_error();
                if error.kind() != std::io::ErrorKind::Interrupted {
                    return Err(error);
                }
            }
        }
    }
}
