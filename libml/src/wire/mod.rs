//! placeholder while the wire codec is written
