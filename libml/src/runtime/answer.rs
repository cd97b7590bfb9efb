//! Answers on the wire: a response or error frame in a fresh mbuf, on the
//! if-manager's TX ring.
//!
//! The frame goes back to the request's source address and port, from the
//! address and port it was sent to (the request's [`FrameAddr`] reversed,
//! VLAN tag kept). Mbufs come from the shared pool; the TX ring is
//! multi-producer, so the IF's threads share one handle behind a mutex (the
//! wrapper allows one handle per process for a single-consumer ring).

use std::sync::Mutex;

use dpdk::{Mempool, Ring};

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

/// Builds and enqueues answers.
#[derive(Debug)]
pub struct Answerer {
    pool: Mempool,
    tx: Mutex<Ring>,
}

impl Answerer {
    /// An answerer over the shared mbuf pool and TX ring.
    pub fn new(pool: Mempool, tx: Ring) -> Self {
        Answerer {
            pool,
            tx: Mutex::new(tx),
        }
    }

    /// Sends an error answer (type 3) with `status`.
    pub fn error(&self, to: &ReplyTo, status: Status, latency_us: u32) -> Result<(), SendError> {
        let repr = ResponseRepr::error(to.if_id, to.request_id, to.send_ts_ns, status, latency_us);
        self.send(to, &repr)
    }

    /// Sends an OK response (type 2) with the top-k results.
    pub fn ok(
        &self,
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
        self.send(to, &repr)
    }

    fn send(&self, to: &ReplyTo, repr: &ResponseRepr<'_>) -> Result<(), SendError> {
        let reply = to.addr.reversed();
        let hdr = reply.header_len();
        let len = hdr + repr.wire_len();
        let mut mbuf = self.pool.alloc().ok_or(SendError::NoMbuf)?;
        let buf = mbuf.append(len).ok_or(SendError::TooLarge)?;
        repr.emit(&mut buf[hdr..])
            .map_err(|_| SendError::TooLarge)?;
        emit_udp_headers(&reply, repr.wire_len(), buf).map_err(|_| SendError::TooLarge)?;
        let ring = self.tx.lock().unwrap_or_else(|p| p.into_inner());
        ring.enqueue(mbuf).map_err(|_| SendError::RingFull)
    }
}
