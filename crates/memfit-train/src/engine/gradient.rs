//! A parameter's accumulated gradient on the host, in one of two forms:
//!
//! - **dense**: f32 values in a buffer taken over from the backend when it can be (flex hands over
//!   a tensor's own buffer when nothing else holds it), so that the gradient of a micro-batch never
//!   exists twice, once in autodiff's container and once here; measured on bert-base b8 s128, that
//!   copy was the step's peak (docs/architecture.md §3);
//! - **rows**: the rows of a table (an embedding) that the step's tokens looked up, every other row
//!   zero. A dense table-sized buffer would be written in full once the allocator hands it memory
//!   that an earlier step used (a reused block is zeroed by `calloc`, unlike fresh pages): on
//!   bert-base-chinese that is 62 MiB of RSS for the ~1,000 rows a b8 s128 batch touches.
//!
//! The optimizer reads either through [`GradientValues`].

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::ops::Range;

use burn::prelude::*;
use burn::tensor::{FloatDType, TensorData};
use memfit_nn::ModelError;

use crate::optim::GradientValues;

pub enum Gradient {
    Dense(TensorData),
    Rows(RowGradient),
}

/// Rows of a `[rows, width]` table; rows not stored are zero.
pub struct RowGradient {
    width: usize,
    /// Row id → its slot in `values`.
    slots: BTreeMap<usize, usize>,
    /// The stored rows, `width` values per slot.
    values: Vec<f32>,
}

impl Gradient {
    /// All zeros, stored as nothing (a parameter that received no gradient this step).
    pub fn zero() -> Self {
        Self::rows(1)
    }

    /// No rows yet of a table whose rows hold `width` values.
    pub fn rows(width: usize) -> Self {
        Self::Rows(RowGradient {
            width: width.max(1),
            slots: BTreeMap::new(),
            values: Vec::new(),
        })
    }

    /// `grad`'s values in f32, its buffer moved out of the backend when possible.
    pub fn take(grad: Tensor<2>) -> Result<Self, ModelError> {
        let data = grad.cast(FloatDType::F32).into_data();
        data.as_slice::<f32>().map_err(|e| {
            ModelError::Io(format!("reading a gradient back from the device: {e:?}"))
        })?;
        Ok(Self::Dense(data))
    }

    /// Adds a dense gradient of the whole parameter (the accumulator becomes dense, taking
    /// `g`'s buffer when it held only rows).
    pub fn add_dense(&mut self, mut g: Gradient) {
        match (&mut *self, &mut g) {
            (Gradient::Dense(_), Gradient::Dense(_)) => add_into(self.stored_mut(), g.stored()),
            (Gradient::Rows(rows), Gradient::Dense(_)) => {
                rows.add_to_table(g.stored_mut());
                *self = g;
            }
            (_, Gradient::Rows(_)) => unreachable!("add_dense takes a dense gradient"),
        }
    }

    /// Adds `values` (`ids.len()` rows of `width`) to the rows `ids`.
    pub fn add_rows(&mut self, ids: &[usize], width: usize, values: &[f32]) {
        match self {
            Gradient::Dense(_) => {
                let rows = ids.iter().copied().zip(values.chunks_exact(width));
                add_rows_into(self.stored_mut(), width, rows);
            }
            Gradient::Rows(rows) => rows.add(ids, values),
        }
    }

    /// Every value, zeros included (a copy for stored rows).
    pub fn to_dense(&self, len: usize) -> Vec<f32> {
        self.dense(len).into_owned()
    }
}

impl RowGradient {
    fn add(&mut self, ids: &[usize], values: &[f32]) {
        let width = self.width;
        for (&id, row) in ids.iter().zip(values.chunks_exact(width)) {
            let next = self.slots.len();
            let slot = *self.slots.entry(id).or_insert(next);
            if slot == next {
                self.values.extend_from_slice(row);
            } else {
                add_into(&mut self.values[slot * width..(slot + 1) * width], row);
            }
        }
    }

    /// Adds the stored rows into `dense`, the whole table.
    fn add_to_table(&self, dense: &mut [f32]) {
        let width = self.width;
        let rows =
            (self.slots.iter()).map(|(&id, &slot)| (id, &self.values[slot * width..][..width]));
        add_rows_into(dense, width, rows);
    }
}

/// `dst += src`, element by element.
fn add_into(dst: &mut [f32], src: &[f32]) {
    dst.iter_mut().zip(src).for_each(|(a, b)| *a += b);
}

/// Adds each `(id, row)` to row `id` of the table `dense` (rows of `width`).
fn add_rows_into<'a>(
    dense: &mut [f32],
    width: usize,
    rows: impl Iterator<Item = (usize, &'a [f32])>,
) {
    for (id, row) in rows {
        add_into(&mut dense[id * width..(id + 1) * width], row);
    }
}

impl GradientValues for Gradient {
    fn parts(&self, len: usize) -> Vec<(Range<usize>, Option<&[f32]>)> {
        let rows = match self {
            Gradient::Dense(_) => return vec![(0..len, Some(self.stored()))],
            Gradient::Rows(rows) => rows,
        };
        let width = rows.width;
        let mut parts = Vec::with_capacity(2 * rows.slots.len() + 1);
        let mut cursor = 0;
        for (&id, &slot) in &rows.slots {
            let start = id * width;
            if start > cursor {
                parts.push((cursor..start, None));
            }
            let values = &rows.values[slot * width..(slot + 1) * width];
            parts.push((start..start + width, Some(values)));
            cursor = start + width;
        }
        if cursor < len {
            parts.push((cursor..len, None));
        }
        parts
    }

    fn stored(&self) -> &[f32] {
        match self {
            // `take` only builds f32 data, checked there.
            Gradient::Dense(data) => data.as_slice().unwrap_or(&[]),
            Gradient::Rows(rows) => &rows.values,
        }
    }

    fn stored_mut(&mut self) -> &mut [f32] {
        match self {
            Gradient::Dense(data) => data.as_mut_slice().unwrap_or(&mut []),
            Gradient::Rows(rows) => &mut rows.values,
        }
    }

    fn dense(&self, len: usize) -> Cow<'_, [f32]> {
        match self {
            Gradient::Dense(_) => Cow::Borrowed(self.stored()),
            Gradient::Rows(rows) => {
                let mut dense = vec![0.0; len];
                rows.add_to_table(&mut dense);
                Cow::Owned(dense)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dense(values: Vec<f32>) -> Gradient {
        let n = values.len();
        Gradient::Dense(TensorData::new(values, [n]))
    }

    #[test]
    fn rows_add_up_and_read_as_the_dense_table() {
        // a 4 × 2 table: rows 2 and 0 looked up, row 2 twice
        let mut g = Gradient::rows(2);
        g.add_rows(&[2, 0, 2], 2, &[1.0, 2.0, 3.0, 4.0, 10.0, 20.0]);
        assert_eq!(
            g.to_dense(8),
            vec![3.0, 4.0, 0.0, 0.0, 11.0, 22.0, 0.0, 0.0]
        );
        let parts: Vec<_> = g
            .parts(8)
            .into_iter()
            .map(|(r, v)| (r, v.is_some()))
            .collect();
        assert_eq!(
            parts,
            vec![(0..2, true), (2..4, false), (4..6, true), (6..8, false)]
        );
        // a dense gradient of the same table (a tied head) makes it dense
        g.add_dense(dense(vec![1.0; 8]));
        assert!(matches!(g, Gradient::Dense(_)));
        assert_eq!(
            g.to_dense(8),
            vec![4.0, 5.0, 1.0, 1.0, 12.0, 23.0, 1.0, 1.0]
        );
        g.add_rows(&[3], 2, &[5.0, 5.0]);
        assert_eq!(&g.stored()[6..], &[6.0, 6.0]);
    }

    /// AdamW and Adafactor (with clipping) move a table the same whether its gradient is stored as
    /// rows or as the dense table, bit for bit, over steps where rows come and go.
    #[test]
    fn optimizers_step_rows_as_the_dense_table() {
        use crate::optim::{
            AdafactorConfig, AdamWConfig, Optimizer, OptimizerConfig, clip_global_norm,
        };
        use memfit_nn::model::ParamShape;
        let shape = ParamShape {
            name: "embeddings.word_embeddings.weight".into(),
            hf_shape: vec![5, 3],
            transposed: false,
            dims: [5, 3],
        };
        for config in [
            OptimizerConfig::AdamW(AdamWConfig::default()),
            OptimizerConfig::Adafactor(AdafactorConfig::default()),
        ] {
            let start: Vec<f32> = (0..15).map(|i| 0.1 * i as f32 - 0.7).collect();
            let (mut w_rows, mut w_dense) = (vec![start.clone()], vec![start]);
            let mut opt_rows = Optimizer::new(config.clone(), vec![shape.clone()], &[true]);
            let mut opt_dense = opt_rows.clone();
            for (step, ids) in [vec![4, 1, 4], vec![2], vec![0, 3]].into_iter().enumerate() {
                let values: Vec<f32> = (0..ids.len() * 3)
                    .map(|i| (i as f32 + step as f32) * 0.37 - 1.0)
                    .collect();
                let mut rows = Gradient::rows(3);
                rows.add_rows(&ids, 3, &values);
                let mut dense = vec![Some(rows.to_dense(15))];
                let mut rows = vec![Some(rows)];
                let n1 = clip_global_norm(&mut rows, 0.5);
                let n2 = clip_global_norm(&mut dense, 0.5);
                assert_eq!(n1.to_bits(), n2.to_bits());
                opt_rows.step(&mut w_rows, &rows, 1e-2);
                opt_dense.step(&mut w_dense, &dense, 1e-2);
                assert_eq!(w_rows, w_dense, "{} step {step}", config.name());
            }
            assert_eq!(opt_rows, opt_dense);
        }
    }

    #[test]
    fn a_zero_gradient_is_one_zero_part() {
        let g = Gradient::zero();
        assert!(g.stored().is_empty());
        assert_eq!(g.parts(5), vec![(0..5, None)]);
        assert_eq!(g.to_dense(3), vec![0.0; 3]);
    }
}
