//! The life-cycle modes of an inference-function process, as its status
//! replies and reports name them.

/// Where an IF stands in the succession of its ring (shared between its
/// fragment thread and its control thread). Which transitions each thread
/// makes, and when, is decided in libml's `runtime::succession`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Mode {
    /// A shadow: model loaded, attached, parked; dequeues nothing.
    Standby = 0,
    /// Told to take over: spinning on the ring's owner word.
    Arming = 1,
    /// Owns the ring and dequeues from it.
    Active = 2,
    /// Told to yield: hands over before its next dequeue.
    Yielding = 3,
    /// Yielded: finishes what it holds (fragments come on its hand-back
    /// ring), then exits.
    Draining = 4,
    /// Stopped or done.
    Done = 5,
}

impl Mode {
    /// Its name in status replies and reports.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Standby => "standby",
            Mode::Arming => "arming",
            Mode::Active => "active",
            Mode::Yielding => "yielding",
            Mode::Draining => "draining",
            Mode::Done => "done",
        }
    }

    /// The mode stored as `v` (`self as u8`); anything unknown is `Done`.
    pub fn from_u8(v: u8) -> Mode {
        match v {
            0 => Mode::Standby,
            1 => Mode::Arming,
            2 => Mode::Active,
            3 => Mode::Yielding,
            4 => Mode::Draining,
            _ => Mode::Done,
        }
    }
}
