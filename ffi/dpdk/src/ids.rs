//! DPDK's integer identifiers as newtypes with a short `Debug`.

use std::fmt;

/// An Ethernet port (`port_id`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PortId(pub u16);

/// A queue of a port (`queue_id`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct QueueId(pub u16);

/// A logical core (`lcore_id`), EAL's name for one of its threads.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LcoreId(pub u32);

/// A NUMA socket (`socket_id`); [`SocketId::ANY`] is DPDK's
/// `SOCKET_ID_ANY` (no constraint).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SocketId(pub i32);

impl SocketId {
    /// No NUMA constraint (`SOCKET_ID_ANY`).
    pub const ANY: SocketId = SocketId(dpdk_sys::SOCKET_ID_ANY);
}

impl fmt::Display for PortId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "port{}", self.0)
    }
}

impl fmt::Display for QueueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "q{}", self.0)
    }
}

impl fmt::Display for LcoreId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "lcore{}", self.0)
    }
}

impl fmt::Display for SocketId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if *self == SocketId::ANY {
            f.write_str("socket-any")
        } else {
            write!(f, "socket{}", self.0)
        }
    }
}

macro_rules! debug_as_display {
    ($($t:ty),*) => {$(
        impl fmt::Debug for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(self, f)
            }
        }
    )*};
}
debug_as_display!(PortId, QueueId, LcoreId, SocketId);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_is_short() {
        assert_eq!(format!("{:?}", PortId(3)), "port3");
        assert_eq!(format!("{:?}", QueueId(0)), "q0");
        assert_eq!(format!("{:?}", LcoreId(1)), "lcore1");
        assert_eq!(format!("{:?}", SocketId(0)), "socket0");
        assert_eq!(format!("{:?}", SocketId::ANY), "socket-any");
    }
}
