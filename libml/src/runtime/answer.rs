//! Answers on the wire: a response or error frame in a fresh mbuf, on the
//! if-manager's TX ring.
//!
//! The frame goes back to the request's source address and port, from the
//! address and port it was sent to (the request's [`FrameAddr`] reversed,
//! VLAN tag kept). Mbufs come from the shared pool; the TX ring is
//! multi-producer, so the IF's threads share its producer side
//! ([`RingProducer`]) without a lock.
//!
//! A batch's answers go out together ([`Answerer::burst`]): their mbufs
//! are allocated in one bulk call and enqueued in one burst, so a batch of
//! eight costs one pool operation and one ring operation, not eight of each.
//! Each enqueue rings the TX ring's doorbell ([`TxBell`]), which wakes an
//! if-manager dozing in its idle back-off.
//!
//! The ring comes *last*, after whatever the caller must record once an
//! answer is on the ring ([`AnswerBurst::send_then`],
//! [`Answerer::error_then`]): the runtime takes the answered requests out
//! of its crash ledger there. Waking the if-manager is a system call, and
//! on a core the IF shares with it the woken if-manager runs at once: a
//! process killed while it waits for its core again would leave answered
//! requests in its ledger, which its successor answers a second time
//! (`handover`'s module doc).

use dpdk::{Mbuf, MbufBurst, Mempool, Ring, RingProducer};

use super::handover::TxBell;

use kp_wire::{
    emit_udp_headers, FrameAddr, IfId, MsgType, RequestKey, ResponseRepr, Status, MAX_RESULTS,
};

/// Where an answer goes and what it echoes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplyTo {
    /// The request's own addressing (reversed when answering).
    pub addr: FrameAddr,
    /// The IF it was for.
    pub if_id: IfId,
    /// Its request id.
    pub request_id: u64,
    /// Its send timestamp, echoed.
    pub send_ts_ns: u64,
}

impl ReplyTo {
    /// The request this answer is for.
    pub fn key(&self) -> RequestKey {
        RequestKey {
            src_ip: self.addr.src_ip,
            src_port: self.addr.src_port,
            if_id: self.if_id,
            request_id: self.request_id,
        }
    }
}

/// Why an answer could not be sent (each is counted by the caller).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SendError {
    /// The mbuf pool is empty.
    NoMbuf,
    /// The frame does not fit an mbuf (top-k too large).
    TooLarge,
    /// The TX ring is full.
    RingFull,
}

/// Answers in one [`AnswerBurst`] at most: the largest batch an IF runs
/// fits many times over; a longer burst is sent in pieces of this size.
pub const ANSWER_BURST: usize = 64;

/// The TX ring is single-producer: answers need a ring any thread can fill.
#[derive(Debug, thiserror::Error)]
#[error("the TX ring {0} is single-producer; the IF's threads must share it")]
pub struct SingleProducerRing(String);

/// Builds and enqueues answers.
#[derive(Debug)]
pub struct Answerer {
    pool: Mempool,
    tx: RingProducer,
    bell: Option<TxBell>,
}

impl Answerer {
    /// An answerer over the shared mbuf pool and TX ring (multi-producer).
    pub fn new(pool: Mempool, tx: Ring) -> Result<Self, SingleProducerRing> {
        let tx = tx
            .into_producer()
            .map_err(|r| SingleProducerRing(r.name().to_string()))?;
        Ok(Answerer {
            pool,
            tx,
            bell: None,
        })
    }

    /// Rings the TX ring's doorbell ([`TxBell`]) after every enqueue, so
    /// that a dozing if-manager sends the answers at once.
    pub fn with_bell(mut self, bell: TxBell) -> Self {
        self.bell = Some(bell);
        self
    }

    /// Wakes the if-manager if it dozes (one atomic add when it does not).
    #[inline]
    fn ring(&self) {
        if let Some(bell) = &self.bell {
            bell.doorbell().ring();
        }
    }

    /// Collects up to `n` answers (a batch's) to send together: their mbufs
    /// come from the pool in one bulk allocation now, and they go on the
    /// ring in one burst when the burst is sent or dropped.
    pub fn burst(&self, n: usize) -> AnswerBurst<'_> {
        let mut fresh = MbufBurst::new();
        let n = n.min(ANSWER_BURST);
        // All or none; without enough, each answer allocates its own.
        let _ = self.pool.alloc_bulk(&mut fresh, n);
        AnswerBurst {
            answerer: self,
            fresh,
            built: MbufBurst::new(),
            ring_full: 0,
            unrung: false,
        }
    }

    /// Sends an error answer (type 3) with `status`, alone (the fragment
    /// thread's rare rejections; a batch's go through [`Self::burst`]).
    pub fn error(&self, to: &ReplyTo, status: Status, latency_us: u32) -> Result<(), SendError> {
        self.error_then(to, status, latency_us, || {})
    }

    /// [`Self::error`], running `done` once the answer is on the TX ring
    /// (or could not be sent) and before the doorbell wakes the
    /// if-manager.
    pub fn error_then(
        &self,
        to: &ReplyTo,
        status: Status,
        latency_us: u32,
        done: impl FnOnce(),
    ) -> Result<(), SendError> {
        let sent = self.enqueue(to, &error_repr(to, status, latency_us));
        done();
        if sent.is_ok() {
            self.ring();
        }
        sent
    }

    fn enqueue(&self, to: &ReplyTo, repr: &ResponseRepr<'_>) -> Result<(), SendError> {
        let mut mbuf = self.pool.alloc().ok_or(SendError::NoMbuf)?;
        build(&mut mbuf, to, repr)?;
        self.tx.enqueue(mbuf).map_err(|_| SendError::RingFull)
    }
}

/// The error answer (type 3) with `status` to `to`.
fn error_repr(to: &ReplyTo, status: Status, latency_us: u32) -> ResponseRepr<'static> {
    ResponseRepr::error(to.if_id, to.request_id, to.send_ts_ns, status, latency_us)
}

/// Writes the answer `repr` to `to` into the fresh `mbuf`.
fn build(mbuf: &mut Mbuf, to: &ReplyTo, repr: &ResponseRepr<'_>) -> Result<(), SendError> {
    let reply = to.addr.reversed();
    let hdr = reply.header_len();
    let len = hdr + repr.wire_len();
    let buf = mbuf.append(len).ok_or(SendError::TooLarge)?;
    repr.emit(&mut buf[hdr..])
        .map_err(|_| SendError::TooLarge)?;
    emit_udp_headers(&reply, repr.wire_len(), buf).map_err(|_| SendError::TooLarge)?;
    Ok(())
}

/// A batch's answers, built into mbufs allocated together and enqueued in
/// one burst ([`Answerer::burst`]). What could not be sent is counted:
/// per answer for a missing mbuf or a frame too large, and in
/// [`AnswerBurst::send`]'s result for a full ring.
#[derive(Debug)]
pub struct AnswerBurst<'a> {
    answerer: &'a Answerer,
    fresh: MbufBurst<ANSWER_BURST>,
    built: MbufBurst<ANSWER_BURST>,
    ring_full: usize,
    /// Whether answers went on the ring since the doorbell last rang.
    unrung: bool,
}

impl AnswerBurst<'_> {
    /// Adds an error answer (type 3) with `status`.
    pub fn error(
        &mut self,
        to: &ReplyTo,
        status: Status,
        latency_us: u32,
    ) -> Result<(), SendError> {
        self.add(to, &error_repr(to, status, latency_us))
    }

    /// Adds an OK response (type 2) with the top-k results.
    pub fn ok(
        &mut self,
        to: &ReplyTo,
        results: &[(u32, f32)],
        batch_size: u16,
        latency_us: u32,
    ) -> Result<(), SendError> {
        let repr = ResponseRepr {
            msg_type: MsgType::Response,
            if_id: to.if_id,
            request_id: to.request_id,
            send_ts_ns: to.send_ts_ns,
            status: Status::Ok,
            batch_size,
            latency_us,
            results: &results[..results.len().min(MAX_RESULTS)],
        };
        self.add(to, &repr)
    }

    fn add(&mut self, to: &ReplyTo, repr: &ResponseRepr<'_>) -> Result<(), SendError> {
        if self.built.is_full() {
            self.flush();
        }
        let mut mbuf = match self.fresh.pop() {
            Some(m) => m,
            None => self.answerer.pool.alloc().ok_or(SendError::NoMbuf)?,
        };
        build(&mut mbuf, to, repr)?;
        self.built.push(mbuf);
        Ok(())
    }

    /// Enqueues what was built; the doorbell rings only in
    /// [`Self::send_then`] (or on drop).
    fn flush(&mut self) {
        let n = self.built.len();
        if n == 0 {
            return;
        }
        let sent = self.answerer.tx.enqueue_burst(&mut self.built);
        self.unrung |= sent > 0;
        if sent < n {
            self.ring_full += n - sent;
            self.built.clear(); // freed in one bulk call
        }
    }

    /// Rings the doorbell once for everything enqueued since the last ring.
    fn ring(&mut self) {
        if std::mem::take(&mut self.unrung) {
            self.answerer.ring();
        }
    }

    /// Enqueues what was added in one burst; returns how many answers the
    /// TX ring had no room for (freed, not retried). Unused mbufs go back
    /// to the pool in one bulk free.
    pub fn send(self) -> usize {
        self.send_then(|| {})
    }

    /// [`Self::send`], running `done` once every answer is on the TX ring
    /// (or was counted as not sent) and before the doorbell wakes the
    /// if-manager: nothing between the enqueue and `done` may block or
    /// make a system call.
    pub fn send_then(mut self, done: impl FnOnce()) -> usize {
        self.flush();
        done();
        self.ring();
        self.ring_full
    }
}

impl Drop for AnswerBurst<'_> {
    fn drop(&mut self) {
        // `send` flushed and rang already; a burst dropped without it
        // still sends.
        self.flush();
        self.ring();
    }
}
