//! The panel's replacement experts (`policies/` in Python), decision for decision on 64-bit keys:
//! LRU, ARC, LIRS, W-TinyLFU, S3-FIFO, SIEVE and the heat frame. Each counts entries; the caller
//! passes what they share (the frequency sketch its owner counts, and the heat of the frame).

pub mod arc;
pub mod frame;
pub mod lirs;
pub mod lists;
pub mod lru;
pub mod mt;
pub mod s3fifo;
pub mod sieve;
pub mod wtinylfu;

use crate::sketch::Sketch;

/// Heat of `n` feature rows (row-major, `width` floats each): the owner's model.
pub type HeatFn<'a> = dyn FnMut(&[f32], usize) -> Vec<f64> + 'a;

/// What an access shares with the experts: the sketch the owner counted (before the access) and,
/// when the owner's model scores, its heat.
pub struct Env<'a, 'h> {
    pub sketch: &'a Sketch,
    pub heat: Option<&'a mut HeatFn<'h>>,
}

pub trait Expert {
    fn contains(&self, key: u64) -> bool;
    fn len(&self) -> usize;
    fn on_hit(&mut self, key: u64, env: &mut Env);
    /// Admits `key` (not resident) and appends what leaves to `out` (`key` itself if rejected).
    fn on_miss(&mut self, key: u64, env: &mut Env, out: &mut Vec<u64>);
    fn on_remove(&mut self, key: u64);
    /// Forget cached heat (the owner's model changed).
    fn invalidate(&mut self) {}
    fn bytes(&self) -> usize;
}

/// The expert `name` at `capacity`; `sketched` W-TinyLFU reads its owner's sketch (else counts one of
/// its own, seeded `seed`), the frame always does; `sample_size` is the shared sketch's (the
/// W-TinyLFU hill climber's period).
pub fn build(
    name: &str,
    capacity: usize,
    seed: u64,
    sketched: bool,
    sample_size: u64,
    frame: &frame::FrameParams,
) -> Result<Box<dyn Expert>, String> {
    Ok(match name {
        "lru" => Box::new(lru::Lru::new(capacity)),
        "arc" => Box::new(arc::Arc::new(capacity)),
        "lirs" => Box::new(lirs::Lirs::new(capacity)),
        "s3fifo" => Box::new(s3fifo::S3Fifo::new(capacity, false)),
        "s3fifo-lcs" => Box::new(s3fifo::S3Fifo::new(capacity, true)),
        "sieve" => Box::new(sieve::Sieve::new(capacity)),
        "wtinylfu" => Box::new(wtinylfu::WTinyLfu::new(
            capacity,
            seed,
            if sketched { Some(sample_size) } else { None },
        )),
        "heat-frame" => Box::new(frame::Frame::new(capacity, seed, frame.clone())),
        _ => return Err(format!("unknown expert {name:?}")),
    })
}
