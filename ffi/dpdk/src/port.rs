//! Ethernet ports: one RX and one TX queue each.

use std::cell::Cell;
use std::ffi::CStr;
use std::fmt;
use std::os::raw::c_char;

use dpdk_sys as sys;

use crate::error::{c_name, check};
use crate::live::{self, EalClaim, Kind};
use crate::{DpdkError, MbufBurst, Mempool, PortId, QueueId, SocketId};

/// A port's counters (`struct rte_eth_stats`, totals only).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PortStats {
    /// Packets received.
    pub ipackets: u64,
    /// Packets sent.
    pub opackets: u64,
    /// Bytes received.
    pub ibytes: u64,
    /// Bytes sent.
    pub obytes: u64,
    /// Packets the hardware dropped because RX queues were full.
    pub imissed: u64,
    /// Erroneous received packets.
    pub ierrors: u64,
    /// Failed transmissions.
    pub oerrors: u64,
    /// RX mbuf allocation failures (the mempool ran dry).
    pub rx_nombuf: u64,
}

/// An Ethernet address.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct MacAddr(pub [u8; 6]);

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            b[0], b[1], b[2], b[3], b[4], b[5]
        )
    }
}

impl fmt::Debug for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Configured,
    Started,
    Stopped,
    Closed,
}

/// An Ethernet port configured with one RX queue and one TX queue
/// ([`QueueId(0)`](QueueId)), default (zeroed) `rte_eth_conf`: no RSS, no
/// offloads. Works with the virtual devices kneepoint uses (`net_pcap`,
/// `net_af_packet`, `net_ring`) and with real NICs.
///
/// Only the primary process configures ports. The handle owns the port:
/// one per port per process; dropping it stops and closes the port (which
/// is also what makes `net_pcap` flush its TX file). It keeps a handle to
/// the RX mempool, so the pool outlives the queue that allocates from it.
///
/// `Send` but not `Sync`: DPDK's burst functions are not thread-safe per
/// queue, so one thread at a time drives the port.
pub struct Port {
    id: PortId,
    name: String,
    socket: SocketId,
    state: Cell<State>,
    _pool: Mempool,
    _claim: EalClaim,
}

// SAFETY:
// - a port id is valid from any thread; the handle is the only one for its
//   port in this process (registry), and not `Sync` (the `Cell`), so moving
//   it hands the queues to exactly one other thread.
unsafe impl Send for Port {}

impl Port {
    /// Number of ports the EAL found (probed PCI devices and `--vdev`s); 0
    /// if the EAL does not run.
    pub fn count_avail() -> u16 {
        let Ok(_claim) = EalClaim::new("rte_eth_dev_count_avail") else {
            return 0;
        };
        // SAFETY:
        // - the EAL runs (claim held); no other precondition.
        unsafe { sys::rte_eth_dev_count_avail() }
    }

    /// The port of the device called `name` (e.g. `"net_pcap0"`,
    /// `"0000:02:00.0"`).
    pub fn id_by_name(name: &str) -> Result<PortId, DpdkError> {
        const OP: &str = "rte_eth_dev_get_port_by_name";
        let cname = c_name(OP, name)?;
        let _claim = EalClaim::new(OP)?;
        let mut id = 0u16;
        // SAFETY:
        // - the EAL runs (claim held); `cname` is a valid C string and `id`
        //   a valid out-pointer.
        let ret = unsafe { sys::rte_eth_dev_get_port_by_name(cname.as_ptr(), &mut id) };
        if ret < 0 {
            return Err(DpdkError::NotFound {
                op: OP,
                name: name.into(),
            });
        }
        Ok(PortId(id))
    }

    /// Configures `port` with one RX queue of `rx_desc` descriptors filled
    /// from `pool`, and one TX queue of `tx_desc` descriptors (both
    /// adjusted to the device's limits). The port is left stopped: call
    /// [`start`](Port::start).
    pub fn init(
        port: PortId,
        pool: &Mempool,
        rx_desc: u16,
        tx_desc: u16,
    ) -> Result<Port, DpdkError> {
        let claim = EalClaim::new("rte_eth_dev_configure")?;
        // SAFETY:
        // - the EAL runs (claim held); any port id may be asked about.
        if unsafe { sys::rte_eth_dev_is_valid_port(port.0) } == 0 {
            return Err(DpdkError::from_errno(
                "rte_eth_dev_is_valid_port",
                libc::ENODEV,
            ));
        }
        let name = port_name(port)?;
        if live::acquire(Kind::Port, usize::from(port.0), true, true).is_err() {
            return Err(DpdkError::Busy {
                op: "rte_eth_dev_configure",
                name,
            });
        }
        let mut this = Port {
            id: port,
            name,
            socket: SocketId::ANY,
            state: Cell::new(State::Configured),
            _pool: pool.clone(),
            _claim: claim,
        };
        match this.setup(rx_desc, tx_desc) {
            Ok(socket) => {
                this.socket = socket;
                Ok(this)
            }
            Err(e) => {
                // Leave the device as it is (not closed), so that it can be
                // configured again.
                this.state.set(State::Closed);
                Err(e)
            }
        }
    }

    fn setup(&self, rx_desc: u16, tx_desc: u16) -> Result<SocketId, DpdkError> {
        let port = self.id;
        let conf = sys::rte_eth_conf::default();
        // SAFETY:
        // - a valid, stopped port owned by this handle; `conf` is a valid,
        //   zeroed configuration that DPDK copies.
        check("rte_eth_dev_configure", unsafe {
            sys::rte_eth_dev_configure(port.0, 1, 1, &conf)
        })?;
        let (mut nb_rx, mut nb_tx) = (rx_desc, tx_desc);
        // SAFETY:
        // - a configured port; both pointers are valid for writes.
        check("rte_eth_dev_adjust_nb_rx_tx_desc", unsafe {
            sys::rte_eth_dev_adjust_nb_rx_tx_desc(port.0, &mut nb_rx, &mut nb_tx)
        })?;
        // SAFETY:
        // - a valid port id.
        let socket = unsafe { sys::rte_eth_dev_socket_id(port.0) };
        let socket = if socket < 0 {
            SocketId::ANY
        } else {
            SocketId(socket)
        };
        // SAFETY:
        // - a configured port with one RX queue (index 0); NULL `rx_conf`
        //   means the driver's defaults; the pool is a live packet pool,
        //   kept alive by `self._pool` for as long as the queue can use it.
        check("rte_eth_rx_queue_setup", unsafe {
            sys::rte_eth_rx_queue_setup(
                port.0,
                0,
                nb_rx,
                socket.0 as u32,
                std::ptr::null(),
                self._pool.as_ptr(),
            )
        })?;
        // SAFETY:
        // - a configured port with one TX queue (index 0); NULL `tx_conf`
        //   means the driver's defaults.
        check("rte_eth_tx_queue_setup", unsafe {
            sys::rte_eth_tx_queue_setup(port.0, 0, nb_tx, socket.0 as u32, std::ptr::null())
        })?;
        Ok(socket)
    }

    /// Starts the port: RX and TX run from now on.
    pub fn start(&self) -> Result<(), DpdkError> {
        match self.state.get() {
            State::Started => return Ok(()),
            State::Closed => return Err(DpdkError::from_errno("rte_eth_dev_start", libc::ENODEV)),
            State::Configured | State::Stopped => {}
        }
        // SAFETY:
        // - a configured port owned by this handle.
        check("rte_eth_dev_start", unsafe {
            sys::rte_eth_dev_start(self.id.0)
        })?;
        self.state.set(State::Started);
        Ok(())
    }

    /// Stops the port (bursts return 0 until it is started again).
    pub fn stop(&self) -> Result<(), DpdkError> {
        if self.state.get() != State::Started {
            return Ok(());
        }
        // Whatever DPDK says, treat the port as stopped: no more bursts.
        self.state.set(State::Stopped);
        // SAFETY:
        // - a started port owned by this handle.
        check("rte_eth_dev_stop", unsafe {
            sys::rte_eth_dev_stop(self.id.0)
        })?;
        Ok(())
    }

    /// Stops (if needed) and closes the port, releasing its queues (and
    /// the mbufs their descriptors held) and flushing `net_pcap`'s TX file.
    /// Nothing but [`name`](Port::name)/[`id`](Port::id) works afterwards.
    pub fn close(&self) -> Result<(), DpdkError> {
        if self.state.get() == State::Closed {
            return Ok(());
        }
        let stopped = self.stop();
        self.state.set(State::Closed);
        // SAFETY:
        // - a stopped port owned by this handle; after this no DPDK call
        //   uses the id again (state is Closed).
        check("rte_eth_dev_close", unsafe {
            sys::rte_eth_dev_close(self.id.0)
        })?;
        stopped
    }

    /// Enables promiscuous mode; a device that does not support it
    /// (`ENOTSUP`, e.g. `net_ring`) is not an error.
    pub fn promiscuous_enable(&self) -> Result<(), DpdkError> {
        if self.state.get() == State::Closed {
            return Ok(());
        }
        // SAFETY:
        // - a configured port owned by this handle.
        match check("rte_eth_promiscuous_enable", unsafe {
            sys::rte_eth_promiscuous_enable(self.id.0)
        }) {
            Err(e) if e.errno() == Some(libc::ENOTSUP) => Ok(()),
            other => other.map(|_| ()),
        }
    }

    /// The port's MAC address (all zeros once closed).
    pub fn mac_addr(&self) -> MacAddr {
        let mut addr = sys::rte_ether_addr::default();
        if self.state.get() == State::Closed {
            return MacAddr::default();
        }
        // SAFETY:
        // - a configured port; `addr` is a valid out-pointer.
        let ret = unsafe { sys::rte_eth_macaddr_get(self.id.0, &mut addr) };
        if ret < 0 {
            return MacAddr::default();
        }
        MacAddr(addr.addr_bytes)
    }

    /// The port's counters. A driver without statistics, or a closed port,
    /// reports zeros.
    pub fn stats(&self) -> PortStats {
        if self.state.get() == State::Closed {
            return PortStats::default();
        }
        let mut s = sys::rte_eth_stats::default();
        // SAFETY:
        // - a configured port; `s` is a valid out-pointer.
        if unsafe { sys::rte_eth_stats_get(self.id.0, &mut s) } < 0 {
            return PortStats::default();
        }
        PortStats {
            ipackets: s.ipackets,
            opackets: s.opackets,
            ibytes: s.ibytes,
            obytes: s.obytes,
            imissed: s.imissed,
            ierrors: s.ierrors,
            oerrors: s.oerrors,
            rx_nombuf: s.rx_nombuf,
        }
    }

    /// Used descriptors of the RX queue (packets waiting), if the driver
    /// can tell.
    pub fn rx_queue_count(&self, queue: QueueId) -> Result<usize, DpdkError> {
        self.check_queue(queue);
        if self.state.get() != State::Started {
            return Ok(0);
        }
        // SAFETY:
        // - a started port with queue `queue` (checked above).
        let n = check("rte_eth_rx_queue_count", unsafe {
            sys::kp_rte_eth_rx_queue_count(self.id.0, queue.0)
        })?;
        Ok(n as usize)
    }

    /// Receives up to `burst.spare()` packets, appending them to `burst`;
    /// returns how many. 0 unless the port is started.
    ///
    /// # Panics
    ///
    /// If `queue` is not `QueueId(0)` (the one RX queue).
    #[inline]
    pub fn rx_burst<const N: usize>(&self, queue: QueueId, burst: &mut MbufBurst<N>) -> usize {
        self.check_queue(queue);
        if self.state.get() != State::Started {
            return 0;
        }
        let (slots, spare) = burst.raw_spare();
        if spare == 0 {
            return 0;
        }
        // SAFETY:
        // - a started port with RX queue `queue`, driven only by this
        //   thread (`Port` is not `Sync`);
        // - `slots` has room for `spare <= u16::MAX` pointers.
        let got = unsafe { sys::kp_rte_eth_rx_burst(self.id.0, queue.0, slots, spare as u16) };
        let got = usize::from(got);
        // SAFETY:
        // - the driver wrote `got <= spare` received, direct mbufs that the
        //   caller now owns.
        unsafe { burst.appended(got) };
        got
    }

    /// Hands packets from the front of `burst` to the TX queue; returns how
    /// many it took. Those taken belong to the driver (which frees them once
    /// sent); the rest stay in `burst`, in order, to retry or drop. 0 unless
    /// the port is started.
    ///
    /// # Panics
    ///
    /// If `queue` is not `QueueId(0)` (the one TX queue).
    #[inline]
    pub fn tx_burst<const N: usize>(&self, queue: QueueId, burst: &mut MbufBurst<N>) -> usize {
        self.check_queue(queue);
        if self.state.get() != State::Started || burst.is_empty() {
            return 0;
        }
        let n = burst.len();
        // SAFETY:
        // - a started port with TX queue `queue`, driven only by this
        //   thread;
        // - the burst's front holds `n <= u16::MAX` owned mbufs.
        let sent =
            unsafe { sys::kp_rte_eth_tx_burst(self.id.0, queue.0, burst.raw_front(), n as u16) };
        let sent = usize::from(sent);
        // SAFETY:
        // - the driver took ownership of the first `sent <= n` mbufs.
        unsafe { burst.taken_from_front(sent) };
        sent
    }

    #[inline]
    fn check_queue(&self, queue: QueueId) {
        assert!(
            queue.0 == 0,
            "{} has one queue per direction, not {queue:?}",
            self.id
        );
    }

    /// Its id.
    pub fn id(&self) -> PortId {
        self.id
    }

    /// The device's name (e.g. `net_pcap0`, a PCI address).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// NUMA socket of the device ([`SocketId::ANY`] if unknown).
    pub fn socket_id(&self) -> SocketId {
        self.socket
    }
}

impl Drop for Port {
    fn drop(&mut self) {
        // Errors cannot be reported from here; close explicitly to see them.
        let _ = self.close();
        live::release(Kind::Port, usize::from(self.id.0));
    }
}

impl fmt::Debug for Port {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Port({}, {:?}, {:?})",
            self.id,
            self.name,
            self.state.get()
        )
    }
}

fn port_name(port: PortId) -> Result<String, DpdkError> {
    let mut buf = [0 as c_char; sys::RTE_ETH_NAME_MAX_LEN as usize];
    // SAFETY:
    // - the EAL runs (caller's claim); `buf` has the RTE_ETH_NAME_MAX_LEN
    //   bytes DPDK requires.
    check("rte_eth_dev_get_name_by_port", unsafe {
        sys::rte_eth_dev_get_name_by_port(port.0, buf.as_mut_ptr())
    })?;
    // SAFETY:
    // - DPDK wrote a NUL-terminated name into `buf`.
    Ok(unsafe { CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .into_owned())
}
