//! The NIC's counters while the if-manager runs, published by the
//! data-plane lcore for the control thread to read.
//!
//! Why the lcore reads them, not the control thread that answers `stats`:
//! `rte_eth_stats_get` is not thread-safe against the poll loop for the
//! drivers we run. `net_pcap` computes `imissed` by calling `pcap_stats`
//! on the very `pcap_t` the RX burst is reading (libpcap handles are not
//! thread-safe) and updates its bookkeeping of it; `net_af_packet` reads
//! plain, non-atomic per-queue counters that the lcore is writing (a data
//! race in C's memory model); DPDK promises nothing for a control call
//! that runs beside a burst on the same port. So only the lcore that owns the port
//! calls it, every [`PORT_STATS_EVERY`] at a clock tick of its loop (a
//! driver call of well under a millisecond ten times a second), and stores
//! the numbers in atomics here; the control thread only loads them.
//!
//! A reader may see one field of a newer reading than another (each is
//! stored on its own); each counter on its own only goes up.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use dpdk::PortStats;
use kp_schema::messages::PortCounters;
use serde_json::Value;

/// How often the lcore reads the port's counters. A Prometheus scrape
/// interval is a second or more, so 100 ms old numbers are fresh to it,
/// and ten driver calls a second cost the poll loop nothing measurable.
pub const PORT_STATS_EVERY: Duration = Duration::from_millis(100);

/// The port's counters as last read (single writer: the data-plane lcore).
#[derive(Debug, Default)]
pub struct PortCounterCells {
    ipackets: AtomicU64,
    opackets: AtomicU64,
    ibytes: AtomicU64,
    obytes: AtomicU64,
    imissed: AtomicU64,
    ierrors: AtomicU64,
    oerrors: AtomicU64,
    rx_nombuf: AtomicU64,
}

impl PortCounterCells {
    /// Stores one reading of the port's counters.
    pub fn publish(&self, s: &PortStats) {
        let set = |c: &AtomicU64, v: u64| c.store(v, Ordering::Relaxed);
        set(&self.ipackets, s.ipackets);
        set(&self.opackets, s.opackets);
        set(&self.ibytes, s.ibytes);
        set(&self.obytes, s.obytes);
        set(&self.imissed, s.imissed);
        set(&self.ierrors, s.ierrors);
        set(&self.oerrors, s.oerrors);
        set(&self.rx_nombuf, s.rx_nombuf);
    }

    /// The last reading.
    pub fn get(&self) -> PortCounters {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        PortCounters {
            ipackets: get(&self.ipackets),
            opackets: get(&self.opackets),
            ibytes: get(&self.ibytes),
            obytes: get(&self.obytes),
            imissed: get(&self.imissed),
            ierrors: get(&self.ierrors),
            oerrors: get(&self.oerrors),
            rx_nombuf: get(&self.rx_nombuf),
        }
    }

    /// The last reading as JSON (the `port` object of the stats).
    pub fn to_json(&self) -> Value {
        serde_json::to_value(self.get()).unwrap_or(Value::Null)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reading_is_read_back_field_by_field() {
        let cells = PortCounterCells::default();
        assert_eq!(cells.get(), PortCounters::default());
        cells.publish(&PortStats {
            ipackets: 1,
            opackets: 2,
            ibytes: 3,
            obytes: 4,
            imissed: 5,
            ierrors: 6,
            oerrors: 7,
            rx_nombuf: 8,
        });
        assert_eq!(
            cells.get(),
            PortCounters {
                ipackets: 1,
                opackets: 2,
                ibytes: 3,
                obytes: 4,
                imissed: 5,
                ierrors: 6,
                oerrors: 7,
                rx_nombuf: 8,
            }
        );
        assert_eq!(
            cells.to_json(),
            serde_json::json!({
                "ipackets": 1, "opackets": 2, "ibytes": 3, "obytes": 4,
                "imissed": 5, "ierrors": 6, "oerrors": 7, "rx_nombuf": 8,
            })
        );
    }
}
