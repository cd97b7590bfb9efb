//! Which ring each `if_id` goes to, changed at run time without locks.
//!
//! The RX lcore owns the routing table outright: a flat array indexed by
//! `if_id` (65536 entries, so a lookup is one load with no hashing). Other
//! threads never touch it; they send [`RouteUpdate`]s over a channel that
//! the RX loop drains every few polls. Removing a route hands the ring back
//! to the sender, so the ring is drained and freed only once the RX loop can
//! no longer enqueue on it — no epoch scheme, no `unsafe`.
//!
//! Generic over the ring type so it is tested without DPDK.

use std::sync::atomic::AtomicU64;
use std::sync::mpsc::{Receiver, Sender, TryRecvError};
use std::sync::Arc;

use kp_wire::IfId;
use libml::runtime::handover::IfControl;

/// Per-IF counters, shared between the RX lcore (only writer) and readers.
#[derive(Debug, Default)]
pub struct IfCounters {
    /// Fragments enqueued on the IF's ring.
    pub delivered: AtomicU64,
    /// Shed notices enqueued (one per request shed on a full ring).
    pub shed: AtomicU64,
    /// Later fragments of shed requests, dropped.
    pub shed_suppressed: AtomicU64,
    /// Fragments dropped because the IF's ring was full, headroom included.
    pub ring_full: AtomicU64,
}

/// One registered inference function, as the RX lcore sees it.
#[derive(Debug)]
pub struct Route<R> {
    /// The IF's fragment ring.
    pub ring: R,
    /// Its counters.
    pub counters: Arc<IfCounters>,
    /// Its control block, whose doorbell wakes the dozing IF (`None`:
    /// nobody to wake, as in tests without DPDK).
    pub control: Option<Arc<IfControl>>,
}

impl<R> Route<R> {
    /// Wakes the IF dozing on this route's ring, if it has a doorbell.
    #[inline]
    pub fn ring_doorbell(&self) {
        if let Some(c) = &self.control {
            c.doorbell().ring();
        }
    }
}

/// A change to the routing table, sent to the RX lcore.
#[derive(Debug)]
pub enum RouteUpdate<R> {
    /// Route `if_id` to this ring from now on.
    Add(IfId, Route<R>),
    /// Stop routing `if_id`; the ring comes back on the sender (`None` if
    /// there was no route) once the RX lcore has let go of it.
    Remove(IfId, Sender<Option<Route<R>>>),
}

/// What [`RouteTable::apply_updates`] changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RouteChange {
    /// `if_id` is routed from now on.
    Added(IfId),
    /// `if_id` is no longer routed.
    Removed(IfId),
}

/// The RX lcore's routing table.
#[derive(Debug)]
pub struct RouteTable<R> {
    routes: Box<[Option<Route<R>>]>,
    /// The IFs that have a route, to visit them without scanning the table.
    live: Vec<u16>,
    updates: Receiver<RouteUpdate<R>>,
}

impl<R> RouteTable<R> {
    /// An empty table fed by `updates`.
    pub fn new(updates: Receiver<RouteUpdate<R>>) -> Self {
        RouteTable {
            routes: (0..=u16::MAX as usize).map(|_| None).collect(),
            live: Vec::new(),
            updates,
        }
    }

    /// The route of `if_id`, if one is registered.
    #[inline]
    pub fn get(&self, if_id: IfId) -> Option<&Route<R>> {
        self.routes[usize::from(if_id.0)].as_ref()
    }

    /// Applies every pending update, telling `changed` of each (so that
    /// per-IF state of the RX loop is made or dropped with the route, off
    /// the data path); returns how many there were.
    ///
    /// An `Add` for an `if_id` that already has a route replaces it and the
    /// old ring is dropped here (the control side refuses duplicates before
    /// sending, so this does not happen in practice).
    pub fn apply_updates(&mut self, mut changed: impl FnMut(RouteChange)) -> usize {
        let mut n = 0;
        loop {
            match self.updates.try_recv() {
                Ok(RouteUpdate::Add(id, route)) => {
                    if self.routes[usize::from(id.0)].replace(route).is_none() {
                        self.live.push(id.0);
                    }
                    changed(RouteChange::Added(id));
                }
                Ok(RouteUpdate::Remove(id, back)) => {
                    let old = self.routes[usize::from(id.0)].take();
                    self.live.retain(|&l| l != id.0);
                    changed(RouteChange::Removed(id));
                    // The requester may have given up waiting; then the
                    // route is simply dropped here.
                    let _ = back.send(old);
                }
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => return n,
            }
            n += 1;
        }
    }

    /// When the batches running in the routed IFs should end
    /// (`IfControl::answer_window`: open, close; monotonic ns).
    pub fn answer_windows(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.live
            .iter()
            .filter_map(|&id| self.routes[usize::from(id)].as_ref()?.control.as_ref())
            .map(|c| c.answer_window())
            .filter(|&(open, _)| open != 0)
    }

    /// Takes every route out of the table (at shutdown, to drain rings).
    pub fn take_all(&mut self) -> Vec<(IfId, Route<R>)> {
        self.live.clear();
        self.routes
            .iter_mut()
            .enumerate()
            .filter_map(|(i, r)| r.take().map(|r| (IfId(i as u16), r)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc::channel;

    #[test]
    fn adds_and_removes_take_effect_when_applied() {
        let (tx, rx) = channel();
        let mut table = RouteTable::<&'static str>::new(rx);
        assert!(table.get(IfId(3)).is_none());
        tx.send(RouteUpdate::Add(
            IfId(3),
            Route {
                control: None,
                ring: "ring3",
                counters: Arc::default(),
            },
        ))
        .unwrap();
        assert!(table.get(IfId(3)).is_none(), "not before apply_updates");
        let mut changes = Vec::new();
        assert_eq!(table.apply_updates(|c| changes.push(c)), 1);
        assert_eq!(changes, [RouteChange::Added(IfId(3))]);
        assert_eq!(table.get(IfId(3)).unwrap().ring, "ring3");
        // A second Add of the same IF replaces its route; it is listed once.
        tx.send(RouteUpdate::Add(
            IfId(3),
            Route {
                control: None,
                ring: "ring3b",
                counters: Arc::default(),
            },
        ))
        .unwrap();
        table.apply_updates(|_| {});
        assert_eq!(table.live, [3]);
        // No control block, nobody to say when answers are due.
        assert_eq!(table.answer_windows().count(), 0);

        let (back_tx, back_rx) = channel();
        tx.send(RouteUpdate::Remove(IfId(3), back_tx.clone()))
            .unwrap();
        tx.send(RouteUpdate::Remove(IfId(4), back_tx)).unwrap();
        assert_eq!(table.apply_updates(|c| changes.push(c)), 2);
        assert_eq!(
            changes[1..],
            [RouteChange::Removed(IfId(3)), RouteChange::Removed(IfId(4))]
        );
        assert!(table.get(IfId(3)).is_none());
        assert_eq!(back_rx.recv().unwrap().unwrap().ring, "ring3b");
        assert!(back_rx.recv().unwrap().is_none(), "no route for if 4");
        assert!(table.live.is_empty());
        assert!(table.take_all().is_empty());
    }
}
