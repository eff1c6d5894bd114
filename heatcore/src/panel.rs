//! `policies/learned/panel.py`'s `ExpertPanel`, decision for decision on 64-bit keys: the experts
//! (miniatures on a spatially hashed 1/R sample of the keys, R > 1, and a full-size driver that
//! leads), the decayed pairwise evidence between them, and who may take the lead.

use crate::experts::frame::FrameParams;
use crate::experts::{build, Env, Expert, HeatFn};
use crate::sketch::Sketch;

const MIX: u64 = 0x9E37_79B9_7F4A_7C15;

pub struct PanelParams {
    pub capacity: usize,
    pub names: Vec<String>,
    pub seed: u64,
    /// The sampling factor R as `panel.sample_rate` gives it.
    pub sample: u64,
    pub horizons: Vec<f64>,
    pub sigmas: Vec<f64>,
    pub min_lead: f64,
    /// W-TinyLFU reads the sketch the panel counts for its owner (else each counts its own).
    pub sketched: bool,
    /// The owner's sketch's seed (the one the full-size sketched experts read).
    pub sketch_seed: u64,
    /// The owner counts its sketch here (`count`) before each access; else `access` counts it.
    pub owner_counts: bool,
    pub frame: FrameParams,
}

pub struct Panel {
    p: PanelParams,
    main: Sketch,
    mini_sketch: Option<Sketch>, // R > 1: the miniatures' own
    minis: Vec<Box<dyn Expert>>,
    driver: Option<Box<dyn Expert>>, // R > 1: the full-size leader
    pub leader: usize,
    decays: Vec<f64>,
    weights: Vec<f64>,
    wins: Vec<Vec<f64>>, // [h][i * n + j]: accesses i hit and j missed, decayed over horizon h
    prefix: Vec<bool>,
    pub hits: Vec<u64>,
    pub switches: u64,
    pub contested: bool,
    out: Vec<u64>,
}

impl Panel {
    pub fn new(p: PanelParams) -> Result<Self, String> {
        let n = p.names.len();
        if n == 0 || n > 16 {
            return Err(format!("a panel runs 1 to 16 experts, not {n}"));
        }
        if p.sigmas.len() != p.horizons.len() {
            return Err("one sigma per horizon".into());
        }
        let sample = p.sample.max(1);
        let mini = ((p.capacity as f64 / sample as f64).round_ties_even() as usize).max(1);
        let main = Sketch::new(p.capacity as u64, p.sketch_seed);
        let mini_sketch = (sample > 1).then(|| Sketch::new(mini as u64, p.seed));
        let mini_sample = mini_sketch
            .as_ref()
            .map_or(main.sample_size, |s| s.sample_size);
        let mut minis = Vec::with_capacity(n);
        for name in &p.names {
            if name == "heat-frame" && !p.sketched {
                return Err("the heat frame reads its owner's sketch (sketched=True)".into());
            }
            minis.push(build(
                name,
                mini,
                p.seed,
                p.sketched,
                mini_sample,
                &p.frame,
            )?);
        }
        let driver = if sample > 1 {
            Some(build(
                &p.names[0],
                p.capacity,
                p.seed,
                p.sketched,
                main.sample_size,
                &p.frame,
            )?)
        } else {
            None
        };
        let decays = p
            .horizons
            .iter()
            .map(|h| 1.0 - 1.0 / (h * mini as f64).max(512.0))
            .collect();
        let h = p.horizons.len();
        Ok(Panel {
            main,
            mini_sketch,
            minis,
            driver,
            leader: 0,
            decays,
            weights: vec![1.0; h],
            wins: vec![vec![0.0; n * n]; h],
            prefix: vec![true; n],
            hits: vec![0; n],
            switches: 0,
            contested: false,
            out: Vec::new(),
            p: PanelParams { sample, ..p },
        })
    }

    pub fn sample(&self) -> u64 {
        self.p.sample
    }

    pub fn sampled(&self, key: u64) -> bool {
        self.p.sample == 1 || (key.wrapping_mul(MIX) >> 32).is_multiple_of(self.p.sample)
    }

    /// Whether the expert the owner follows holds `key`.
    pub fn holds(&self, key: u64) -> bool {
        match &self.driver {
            Some(d) => d.contains(key),
            None => self.minis[self.leader].contains(key),
        }
    }

    /// The number of experts and of horizons.
    pub fn shape(&self) -> (usize, usize) {
        (self.minis.len(), self.weights.len())
    }

    pub fn driver_len(&self) -> usize {
        self.driver
            .as_ref()
            .map_or(self.minis[self.leader].len(), |d| d.len())
    }

    /// One access in the experts (the sketch counted first); the keys the driver evicted or
    /// rejected are left in `out()`.
    pub fn access(&mut self, key: u64, chained: bool, heat: Option<&mut HeatFn>) -> &[u64] {
        self.out.clear();
        if !self.p.owner_counts {
            self.count(key);
        }
        let Some(driver) = self.driver.as_mut() else {
            let mut env = Env {
                sketch: &self.main,
                heat,
            };
            let hits = Self::evidence(
                &mut self.minis,
                &mut self.prefix,
                &mut self.hits,
                &mut self.contested,
                &mut self.out,
                self.leader,
                key,
                chained,
                true,
                &mut env,
            );
            self.weigh(hits);
            return &self.out;
        };
        let mut heat = heat;
        {
            let mut env = Env {
                sketch: &self.main,
                heat: heat.as_deref_mut(),
            };
            if driver.contains(key) {
                driver.on_hit(key, &mut env);
            } else {
                driver.on_miss(key, &mut env, &mut self.out);
            }
        }
        if self.sampled(key) {
            let ms = self
                .mini_sketch
                .as_mut()
                .expect("R > 1 has a miniature sketch");
            let pos = ms.positions(key as i64);
            ms.increment_at(&pos);
            let mut env = Env { sketch: ms, heat };
            let mut sink = Vec::new();
            let hits = Self::evidence(
                &mut self.minis,
                &mut self.prefix,
                &mut self.hits,
                &mut self.contested,
                &mut sink,
                self.leader,
                key,
                chained,
                false,
                &mut env,
            );
            self.weigh(hits);
        } else {
            self.contested = false;
        }
        &self.out
    }

    #[allow(clippy::too_many_arguments)]
    fn evidence(
        minis: &mut [Box<dyn Expert>],
        prefix: &mut [bool],
        hits_of: &mut [u64],
        contested: &mut bool,
        out: &mut Vec<u64>,
        leader: usize,
        key: u64,
        chained: bool,
        drives: bool,
        env: &mut Env,
    ) -> u32 {
        if !chained {
            prefix.iter_mut().for_each(|p| *p = true);
        }
        let mut hits = 0u32;
        let mut sink = Vec::new();
        for (i, shadow) in minis.iter_mut().enumerate() {
            if shadow.contains(key) {
                shadow.on_hit(key, env);
                if prefix[i] {
                    hits |= 1 << i;
                    hits_of[i] += 1;
                }
            } else {
                prefix[i] = false;
                if i == leader && drives {
                    shadow.on_miss(key, env, out);
                } else {
                    sink.clear();
                    shadow.on_miss(key, env, &mut sink);
                }
            }
        }
        *contested = hits != 0 && (hits >> leader) & 1 == 0;
        hits
    }

    /// One sampled access's evidence: bit i of `hits`, expert i hit (within its prefix).
    fn weigh(&mut self, hits: u32) {
        let n = self.p.names.len();
        for (w, d) in self.weights.iter_mut().zip(&self.decays) {
            *w /= d;
        }
        let all = (1u32 << n) - 1;
        if hits != 0 && hits < all {
            for (h, wins) in self.wins.iter_mut().enumerate() {
                let weight = self.weights[h];
                for i in 0..n {
                    if hits >> i & 1 == 0 {
                        continue;
                    }
                    for j in 0..n {
                        if hits >> j & 1 == 0 {
                            wins[i * n + j] += weight;
                        }
                    }
                }
            }
        }
        if self.weights.iter().copied().fold(f64::MIN, f64::max) > 1e150 {
            for (wins, w) in self.wins.iter_mut().zip(self.weights.iter_mut()) {
                let by = *w;
                wins.iter_mut().for_each(|x| *x /= by);
                *w = 1.0;
            }
        }
    }

    /// Decayed count of accesses expert i hit and j missed, minus the converse.
    pub fn lead(&self, i: usize, j: usize, horizon: usize) -> f64 {
        let n = self.p.names.len();
        let wins = &self.wins[horizon];
        (wins[i * n + j] - wins[j * n + i]) / self.weights[horizon]
    }

    /// The experts with a significant lead over the leader, each with that lead.
    pub fn challengers(&self) -> Vec<(usize, f64)> {
        let n = self.p.names.len();
        let leader = self.leader;
        let mut found = Vec::new();
        for i in 0..n {
            if i == leader {
                continue;
            }
            let (mut significant, mut trailing, mut lead_i) = (false, false, 0.0f64);
            for ((wins, w), sigmas) in self.wins.iter().zip(&self.weights).zip(&self.p.sigmas) {
                let win = wins[i * n + leader] / w;
                let loss = wins[leader * n + i] / w;
                let lead = win - loss;
                trailing |= lead < 0.0;
                if lead > self.p.min_lead && lead > sigmas * (win + loss).sqrt() {
                    significant = true;
                    lead_i = lead_i.max(lead);
                }
            }
            if significant && !trailing {
                found.push((i, lead_i));
            }
        }
        found
    }

    /// About how many of `resident` the expert does not hold (from its miniature, times R).
    pub fn missing(&self, expert: usize, resident: &[u64]) -> f64 {
        let shadow = &self.minis[expert];
        if self.p.sample == 1 {
            return resident.iter().filter(|&&k| !shadow.contains(k)).count() as f64;
        }
        let missed = resident
            .iter()
            .filter(|&&k| self.sampled(k) && !shadow.contains(k))
            .count();
        (self.p.sample as usize * missed) as f64
    }

    /// Lead with `expert`; at R > 1 a full-size one is built and handed `resident`, oldest first.
    pub fn follow(
        &mut self,
        expert: usize,
        resident: &[u64],
        heat: Option<&mut HeatFn>,
    ) -> Result<(), String> {
        if expert >= self.minis.len() {
            return Err(format!("no expert {expert}"));
        }
        if expert == self.leader {
            return Ok(());
        }
        self.leader = expert;
        self.switches += 1;
        if self.p.sample == 1 {
            return Ok(());
        }
        let p = &self.p;
        let mut driver = build(
            &p.names[expert],
            p.capacity,
            p.seed,
            p.sketched,
            self.main.sample_size,
            &p.frame,
        )?;
        let mut env = Env {
            sketch: &self.main,
            heat,
        };
        let mut sink = Vec::new();
        for &key in resident {
            if !driver.contains(key) {
                sink.clear();
                driver.on_miss(key, &mut env, &mut sink);
            }
        }
        self.driver = Some(driver);
        Ok(())
    }

    /// `key` left for a reason outside the experts (an oracle, a delete): every expert drops it.
    pub fn remove(&mut self, key: u64) {
        for m in self.minis.iter_mut().chain(self.driver.as_mut()) {
            if m.contains(key) {
                m.on_remove(key);
            }
        }
    }

    /// The experts (`names` order) whose miniature holds `key`.
    pub fn holders(&self, key: u64) -> Vec<usize> {
        (0..self.minis.len())
            .filter(|&i| self.minis[i].contains(key))
            .collect()
    }

    /// The owner's model changed: the frames forget cached heat.
    pub fn invalidate(&mut self) {
        self.minis.iter_mut().for_each(|m| m.invalidate());
        if let Some(d) = self.driver.as_mut() {
            d.invalidate();
        }
    }

    /// One access of `key` in the owner's sketch.
    pub fn count(&mut self, key: u64) {
        let pos = self.main.positions(key as i64);
        self.main.increment_at(&pos);
    }

    pub fn sketch(&self) -> &Sketch {
        &self.main
    }

    pub fn frequency(&self, key: u64) -> u8 {
        self.main.frequency_at(&self.main.positions(key as i64))
    }

    pub fn bytes(&self) -> usize {
        self.main.bytes()
            + self.mini_sketch.as_ref().map_or(0, Sketch::bytes)
            + self.minis.iter().map(|m| m.bytes()).sum::<usize>()
            + self.driver.as_ref().map_or(0, |d| d.bytes())
    }
}
