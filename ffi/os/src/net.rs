//! UDP calls std does not have: several datagrams in one system call
//! (`sendmmsg`), and the receive buffer's size (`SO_RCVBUF`).
//!
//! A client sends a request as many datagrams back to back (a 224x224x3
//! image is 147); one `send` per datagram is one kernel entry and exit
//! each. [`send_batch`] hands the kernel up to [`MAX_BATCH`] of them at
//! once, on a *connected* socket (no addresses: each goes to the peer it is
//! connected to, as `send` would).

use std::io;
use std::net::UdpSocket;
use std::os::fd::AsRawFd;

/// Most datagrams one [`send_batch`] call passes to the kernel (the rest
/// of a longer slice is left for the next call; see its return value).
pub const MAX_BATCH: usize = 64;

/// Sends the first datagrams of `datagrams` (at most [`MAX_BATCH`]) on the
/// connected `socket` in one `sendmmsg` call, each as its own datagram, in
/// order. Returns how many were sent, `1..=min(len, MAX_BATCH)`: fewer
/// than asked is a partial send, and the caller sends the rest with
/// another call. An error means none of them was sent (the kernel reports
/// an error only when the first one failed; a failure after that shortens
/// the count instead, and the same error, if it persists, comes from the
/// next call). An empty slice sends nothing and returns 0.
pub fn send_batch(socket: &UdpSocket, datagrams: &[&[u8]]) -> io::Result<usize> {
    let n = datagrams.len().min(MAX_BATCH);
    if n == 0 {
        return Ok(0);
    }
    let mut iov = [libc::iovec {
        iov_base: std::ptr::null_mut(),
        iov_len: 0,
    }; MAX_BATCH];
    // SAFETY: mmsghdr is plain data (integers and pointers), for which all
    // zeroes is a valid value: null names, iovecs and control data.
    let mut msgs: [libc::mmsghdr; MAX_BATCH] = unsafe { std::mem::zeroed() };
    for (i, d) in datagrams[..n].iter().enumerate() {
        iov[i] = libc::iovec {
            // The kernel only reads through it (a send).
            iov_base: d.as_ptr().cast_mut().cast::<libc::c_void>(),
            iov_len: d.len(),
        };
        msgs[i].msg_hdr.msg_iov = &mut iov[i];
        msgs[i].msg_hdr.msg_iovlen = 1;
    }
    // SAFETY: `msgs[..n]` are initialised mmsghdrs, each pointing at one
    // iovec of `iov`, which points at a live datagram slice of `n` bytes;
    // all outlive the call, and a send only reads them (the kernel writes
    // only `msg_len` of each mmsghdr, inside `msgs`). No name: the socket
    // is connected. `n <= MAX_BATCH` fits the `c_uint`.
    let sent =
        unsafe { libc::sendmmsg(socket.as_raw_fd(), msgs.as_mut_ptr(), n as libc::c_uint, 0) };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(sent as usize)
}

/// Sets `socket`'s receive buffer (`SO_RCVBUF`) to `bytes` (the kernel
/// doubles it for its bookkeeping and caps it at `net.core.rmem_max`).
pub fn set_recv_buffer(socket: &UdpSocket, bytes: usize) -> io::Result<()> {
    let value = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
    // SAFETY: `value` is a live c_int for the call and its size is passed;
    // setsockopt only reads it.
    let r = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            (&value as *const libc::c_int).cast::<libc::c_void>(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn pair() -> (UdpSocket, UdpSocket) {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        set_recv_buffer(&rx, 4 << 20).unwrap();
        rx.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        tx.connect(rx.local_addr().unwrap()).unwrap();
        (tx, rx)
    }

    #[test]
    fn a_batch_arrives_as_separate_datagrams_in_order() {
        let (tx, rx) = pair();
        let data: Vec<Vec<u8>> = (0..5u8).map(|i| vec![i; 10 + usize::from(i)]).collect();
        let refs: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
        assert_eq!(send_batch(&tx, &refs).unwrap(), 5);
        let mut buf = [0u8; 64];
        for d in &data {
            let n = rx.recv(&mut buf).unwrap();
            assert_eq!(&buf[..n], &d[..]);
        }
        assert_eq!(send_batch(&tx, &[]).unwrap(), 0);
    }

    #[test]
    fn at_most_max_batch_go_per_call() {
        let (tx, rx) = pair();
        let data: Vec<[u8; 2]> = (0..MAX_BATCH as u16 + 3).map(u16::to_be_bytes).collect();
        let refs: Vec<&[u8]> = data.iter().map(|d| &d[..]).collect();
        let mut off = 0;
        while off < refs.len() {
            let n = send_batch(&tx, &refs[off..]).unwrap();
            assert!((1..=MAX_BATCH).contains(&n));
            off += n;
        }
        let mut buf = [0u8; 8];
        for d in &data {
            assert_eq!(rx.recv(&mut buf).unwrap(), 2);
            assert_eq!(&buf[..2], d);
        }
    }

    #[test]
    fn errors_are_the_sockets() {
        // Not connected: no destination.
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let e = send_batch(&tx, &[b"x"]).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EDESTADDRREQ));
        // An ICMP port unreachable for an earlier datagram comes back as
        // ConnectionRefused, once.
        let gone = UdpSocket::bind("127.0.0.1:0").unwrap();
        let addr = gone.local_addr().unwrap();
        drop(gone);
        tx.connect(addr).unwrap();
        let mut refused = false;
        for _ in 0..50 {
            match send_batch(&tx, &[b"x"]) {
                Ok(n) => assert_eq!(n, 1),
                Err(e) => {
                    assert_eq!(e.kind(), io::ErrorKind::ConnectionRefused);
                    refused = true;
                    break;
                }
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        assert!(refused, "no ConnectionRefused from a closed port");
    }
}
