//! The receive low-water mark of a consumer's socket (Linux's `SO_RCVLOWAT`), raised while
//! its connection gathers the consumer's answers: a packet then no longer makes the socket
//! readable, so the consumer's FINs, one packet each, do not wake the endpoint one by one.
//! Lowering it again makes Linux report the socket readable at once if anything arrived
//! meanwhile (`tcp_set_rcvlowat` checks), and a closed connection is reported whatever the
//! mark. Elsewhere the mark is left alone: the gathering still reads many answers at once,
//! only the wake-ups stay.

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
