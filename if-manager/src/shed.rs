//! Shedding on a full IF ring without losing any request's answer.
//!
//! When an IF falls behind, its ring fills and the if-manager — which never
//! blocks on an IF — must drop fragments. Dropping them silently would break
//! docs/PROTOCOL.md's promise of exactly one answer per request: a request none of
//! whose fragments reached the IF would get no answer at all. So a request
//! that loses a fragment is *shed* instead:
//!
//! 1. its first fragment that finds no room becomes the request's **shed
//!    notice**: one byte of the frame is rewritten in place
//!    ([`kp_wire::mark_shed_notice`]) and the mbuf goes on the IF's ring
//!    after every fragment of the request already there;
//! 2. the request is remembered here for the answered-table time-to-live, and
//!    its later fragments are dropped ([`Outcome::ShedSuppressed`]), even once
//!    the ring has room again;
//! 3. the IF, on the notice, answers the request OVERLOADED — once: if it
//!    already answered it (or handed it to inference) it stays silent
//!    (`libml::reassembly::Reassembler::on_shed_notice`).
//!
//! Notices must not be dropped in turn, so they do not compete with data for
//! the ring: [`shed_headroom`] slots of every ring are kept free of data, and
//! a notice that still finds no room waits in a bounded per-IF queue here,
//! flushed before any data of that IF (and every clock tick), so it reaches
//! the IF as soon as the IF dequeues anything. While notices wait, all of
//! that IF's data is shed. A notice that arrives late is harmless: if the IF
//! meanwhile answered the request INCOMPLETE, the notice is `Late` there.
//!
//! Only when that queue is full too ([`PENDING_PER_IF`] requests shed while
//! the IF dequeued nothing) is a fragment lost without a notice, counted as
//! [`Outcome::RingFull`]; the request is not remembered, so its next
//! fragment tries again.
//!
//! The shed path is the overload path, so it does no more work than the
//! normal one: the fragment was classified once already and its request key
//! and header offset travel with it ([`Staged`]), and every IF's notice queue
//! is allocated whole when its route is added ([`Shedder::prepare`]) and never
//! grows: nothing is parsed twice and nothing is allocated under overload.

use std::collections::VecDeque;

use dpdk::{Mbuf, Ring};
use kp_wire::answered::{Answer, AnsweredTable};
use kp_wire::{IfId, RequestKey};

use crate::outcome::{bump, Counters, Outcome};
use crate::routes::RouteTable;

/// Shed notices that may wait for ring room, per IF.
pub const PENDING_PER_IF: usize = 4096;

/// Whether the producer rings an IF's doorbell after an enqueue
/// (libml's `Doorbell`): the burst held the first or the last fragment of a
/// request (`edge`), shed notices went into the ring (`flushed`), fragments
/// found no room (`lost`), or the ring holds more than a quarter of its
/// `capacity`. Fragments in between can wait for the next ring: the IF
/// dozes until then, and wakes about twice per request instead of once per
/// burst.
pub fn wakes_the_if(edge: bool, flushed: bool, lost: u64, count: usize, capacity: usize) -> bool {
    edge || flushed || lost > 0 || count > capacity / 4
}

/// Slots of an IF ring of `capacity` kept free of data for shed notices:
/// an eighth, at least one.
pub fn shed_headroom(capacity: usize) -> usize {
    (capacity / 8).max(1)
}

/// What classification found out about a staged fragment, kept beside its
/// mbuf so that shedding it needs no second parse.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Staged {
    /// Its request.
    pub key: RequestKey,
    /// Where its kneepoint header starts in the frame.
    pub header_at: usize,
}

impl Default for Staged {
    /// A placeholder for an empty staging slot (never read before written).
    fn default() -> Self {
        Staged {
            key: RequestKey {
                src_ip: std::net::Ipv4Addr::UNSPECIFIED,
                src_port: 0,
                if_id: IfId(0),
                request_id: 0,
            },
            header_at: 0,
        }
    }
}

/// A queue of at most `capacity` items, allocated whole up front: a push
/// never allocates, a full queue refuses.
#[derive(Debug)]
pub struct BoundedQueue<T> {
    items: VecDeque<T>,
    capacity: usize,
}

impl<T> BoundedQueue<T> {
    /// An empty queue with room for `capacity` items, allocated now.
    pub fn new(capacity: usize) -> Self {
        BoundedQueue {
            items: VecDeque::with_capacity(capacity),
            capacity,
        }
    }

    /// Items queued.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// True if none is queued.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Appends `item`, or gives it back if the queue is full.
    pub fn push_back(&mut self, item: T) -> Result<(), T> {
        if self.items.len() >= self.capacity {
            return Err(item);
        }
        // Below capacity: VecDeque does not reallocate.
        self.items.push_back(item);
        Ok(())
    }

    /// Hands items to `put`, oldest first, until it gives one back (no
    /// room); that one stays first. Returns how many went.
    pub fn drain_into(&mut self, mut put: impl FnMut(T) -> Result<(), T>) -> usize {
        let mut moved = 0;
        while let Some(item) = self.items.pop_front() {
            if let Err(item) = put(item) {
                self.items.push_front(item);
                break;
            }
            moved += 1;
        }
        moved
    }

    /// Drops every item; returns how many there were.
    pub fn clear(&mut self) -> usize {
        let n = self.items.len();
        self.items.clear();
        n
    }
}

/// The shed requests and the notices waiting for room (owned by the RX
/// loop).
#[derive(Debug)]
pub struct Shedder {
    table: AnsweredTable,
    ttl_ns: u64,
    /// Until when a fragment may belong to a remembered shed request (no
    /// lookup at all while nothing was shed for a time-to-live).
    active_until_ns: u64,
    /// Per routed IF, its waiting notices (allocated by [`Self::prepare`]).
    pending: Vec<(IfId, BoundedQueue<Mbuf>)>,
    pending_total: usize,
}

impl Shedder {
    /// Remembers up to `capacity` shed requests for `ttl_ns` each.
    pub fn new(capacity: usize, ttl_ns: u64) -> Self {
        Shedder {
            table: AnsweredTable::new(capacity, ttl_ns),
            ttl_ns,
            active_until_ns: 0,
            pending: Vec::new(),
            pending_total: 0,
        }
    }

    /// `if_id` got a route: allocates its notice queue now, off the data
    /// path (a no-op if it has one).
    pub fn prepare(&mut self, if_id: IfId) {
        if self.queue_mut(if_id).is_none() {
            self.pending
                .push((if_id, BoundedQueue::new(PENDING_PER_IF)));
        }
    }

    /// `if_id` lost its route: its waiting notices can never be delivered;
    /// they are freed, counted in `notices_dropped`, with the queue.
    pub fn forget(&mut self, if_id: IfId, counters: &Counters) {
        if let Some(i) = self.pending.iter().position(|(id, _)| *id == if_id) {
            let (_, mut q) = self.pending.swap_remove(i);
            let n = q.clear();
            self.pending_total -= n;
            bump(&counters.notices_dropped, n as u64);
        }
    }

    /// Whether a fragment of request `key` is to be dropped because its
    /// request was shed. One comparison while nothing was shed recently.
    #[inline]
    pub fn suppresses(&self, key: &RequestKey, now_ns: u64) -> bool {
        now_ns < self.active_until_ns && self.table.contains(key, now_ns)
    }

    /// Notices waiting for room, over all IFs.
    pub fn pending(&self) -> usize {
        self.pending_total
    }

    /// Moves `if_id`'s waiting notices onto its ring, oldest first; true if
    /// none is left waiting (data may go on the ring).
    #[inline]
    pub fn flush(&mut self, if_id: IfId, ring: &Ring) -> bool {
        if self.pending_total == 0 {
            return true;
        }
        let Some(q) = self.queue_mut(if_id) else {
            return true;
        };
        let moved = q.drain_into(|m| ring.enqueue(m));
        let left = q.is_empty();
        self.pending_total -= moved;
        left
    }

    /// Flushes every IF's waiting notices (every clock tick while some
    /// wait).
    pub fn flush_all(&mut self, routes: &RouteTable<Ring>) {
        let mut moved = 0;
        for (id, q) in &mut self.pending {
            if q.is_empty() {
                continue;
            }
            // Every queued IF has a route: a removed one is `forget`-ed.
            if let Some(route) = routes.get(*id) {
                let n = q.drain_into(|m| route.ring.enqueue(m));
                if n > 0 {
                    route.ring_doorbell(); // a notice completes a request
                }
                moved += n;
            }
        }
        self.pending_total -= moved;
    }

    /// Frees every waiting notice (at shutdown), counted.
    pub fn clear(&mut self, counters: &Counters) {
        for (_, q) in &mut self.pending {
            bump(&counters.notices_dropped, q.clear() as u64);
        }
        self.pending_total = 0;
    }

    /// Sheds `mbuf`, a fragment for `if_id` that found no room for data on
    /// `ring` (`staged`: what classifying it found); returns its outcome
    /// (see the module doc).
    pub fn shed(
        &mut self,
        if_id: IfId,
        ring: &Ring,
        counters: &Counters,
        mut mbuf: Mbuf,
        staged: Staged,
        now_ns: u64,
    ) -> Outcome {
        let key = staged.key;
        if self.table.contains(&key, now_ns) {
            return Outcome::ShedSuppressed;
        }
        let Some(i) = self.pending.iter().position(|(id, _)| *id == if_id) else {
            return Outcome::RingFull; // no route, no queue: cannot happen
        };
        let waiting = self.pending[i].1.len();
        if waiting >= PENDING_PER_IF {
            return Outcome::RingFull;
        }
        let Some(header) = mbuf.data_mut().get_mut(staged.header_at..) else {
            return Outcome::RingFull;
        };
        if !kp_wire::mark_shed_notice(header) {
            return Outcome::RingFull;
        }
        if let Answer::Now { evicted_live: true } = self.table.first_answer(&key, now_ns) {
            bump(&counters.answered_evictions, 1);
        }
        self.active_until_ns = now_ns.saturating_add(self.ttl_ns);
        // Behind any notice already waiting, to keep them in order.
        let mbuf = if waiting == 0 {
            match ring.enqueue(mbuf) {
                Ok(()) => return Outcome::Shed,
                Err(m) => m,
            }
        } else {
            mbuf
        };
        // Checked above: there is room, and the push does not allocate.
        if self.pending[i].1.push_back(mbuf).is_ok() {
            self.pending_total += 1;
        }
        Outcome::Shed
    }

    fn queue_mut(&mut self, if_id: IfId) -> Option<&mut BoundedQueue<Mbuf>> {
        self.pending
            .iter_mut()
            .find(|(id, _)| *id == if_id)
            .map(|(_, q)| q)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_doorbell_rings_at_a_requests_edges_on_shedding_and_when_the_ring_fills() {
        use super::wakes_the_if;
        // (edge, flushed, lost, count, capacity) -> rings
        let cases = [
            ((false, false, 0, 10, 1024), false), // a middle fragment: waits
            ((true, false, 0, 10, 1024), true),   // first or last
            ((false, true, 0, 10, 1024), true),   // a shed notice went in
            ((false, false, 3, 10, 1024), true),  // the ring overflowed
            ((false, false, 0, 256, 1024), false),
            ((false, false, 0, 257, 1024), true), // over a quarter full
        ];
        for ((edge, flushed, lost, count, cap), rings) in cases {
            assert_eq!(
                wakes_the_if(edge, flushed, lost, count, cap),
                rings,
                "{:?}",
                (edge, flushed, lost, count, cap)
            );
        }
    }

    use super::BoundedQueue;

    #[test]
    fn a_bounded_queue_refuses_when_full_and_never_grows() {
        let mut q = BoundedQueue::new(3);
        let cap = q.items.capacity();
        for i in 0..3 {
            assert_eq!(q.push_back(i), Ok(()));
        }
        assert_eq!(q.push_back(9), Err(9), "full");
        assert_eq!(q.len(), 3);
        assert_eq!(q.items.capacity(), cap, "no reallocation");
    }

    #[test]
    fn draining_stops_at_the_first_refusal_and_keeps_the_order() {
        let mut q = BoundedQueue::new(8);
        for i in 0..5 {
            q.push_back(i).unwrap();
        }
        let mut taken = Vec::new();
        let moved = q.drain_into(|x| {
            if taken.len() == 2 {
                Err(x)
            } else {
                taken.push(x);
                Ok(())
            }
        });
        assert_eq!(moved, 2);
        assert_eq!(taken, [0, 1]);
        assert_eq!(q.len(), 3);
        let mut rest = Vec::new();
        assert_eq!(
            q.drain_into(|x| {
                rest.push(x);
                Ok(())
            }),
            3
        );
        assert_eq!(rest, [2, 3, 4], "the refused one stayed first");
        assert!(q.is_empty());
        assert_eq!(q.clear(), 0);
    }
}
