//! Parameters laid end to end in one f32 tensor, so that an optimizer step launches one kernel per
//! op for all of them instead of one per parameter tensor: on a GPU, about 20 launches per
//! parameter tensor a step (the update, the gradient norm, the recast) were half of t5-small's and
//! bert-base's launches, each costing host time whatever its size.
//!
//! Each parameter starts at a multiple of [`ALIGN`] elements, so that its view is a slice of the
//! buffer, not a copy: cubecl copies a slice whose start is not aligned to the device's memory
//! alignment (512 bytes on CUDA: 128 f32 or 256 bf16 elements). The padding stays zero.

use std::ops::Range;

use burn::prelude::*;
use burn::tensor::{DType, TensorData};
use memfit_nn::ModelError;
use memfit_nn::layers::host::to_f32_vec;

/// Elements between the starts of two parameters: a multiple of this.
pub const ALIGN: usize = 256;

/// Elements of a chunk (64 MiB of f32) unless one parameter alone is larger: an update's
/// full-size temporaries are one chunk's, about what the largest parameter's were when each
/// parameter was updated on its own.
pub const CHUNK: usize = 1 << 24;

/// Where each laid-out parameter sits (`None`: not laid out): in which chunk, from where.
#[derive(Debug, Clone, PartialEq)]
pub struct FlatLayout {
    places: Vec<Option<Place>>,
    /// Elements of each chunk, padding included.
    chunks: Vec<usize>,
}

/// Parameters laid out as a [`FlatLayout`] says: one 1-D f32 tensor per chunk.
pub type Flat = Vec<Tensor<1>>;

#[derive(Debug, Clone, Copy, PartialEq)]
struct Place {
    chunk: usize,
    start: usize,
    dims: [usize; 2],
}

impl Place {
    fn range(&self) -> Range<usize> {
        self.start..self.start + self.dims[0] * self.dims[1]
    }
}

impl FlatLayout {
    /// Parameter `i` laid out where `dims[i]` is `Some`, in index order, a new chunk begun where
    /// the next parameter would take the current one past [`CHUNK`].
    pub fn new(dims: impl IntoIterator<Item = Option<[usize; 2]>>) -> Self {
        let mut chunks: Vec<usize> = Vec::new();
        let places = (dims.into_iter())
            .map(|d| {
                d.map(|dims| {
                    let size = (dims[0] * dims[1]).next_multiple_of(ALIGN);
                    match chunks.last() {
                        Some(&len) if len + size <= CHUNK => {}
                        _ => chunks.push(0),
                    }
                    let chunk = chunks.len() - 1;
                    let start = chunks[chunk];
                    chunks[chunk] += size;
                    Place { chunk, start, dims }
                })
            })
            .collect();
        Self { places, chunks }
    }

    /// Elements of every chunk, padding included.
    pub fn len(&self) -> usize {
        self.chunks.iter().sum()
    }

    pub fn is_empty(&self) -> bool {
        self.chunks.is_empty()
    }

    pub fn contains(&self, index: usize) -> bool {
        matches!(self.places.get(index), Some(Some(_)))
    }

    /// The laid-out parameters' indices, in order.
    pub fn indices(&self) -> impl Iterator<Item = usize> + '_ {
        (self.places.iter().enumerate()).filter_map(|(i, p)| p.map(|_| i))
    }

    /// The chunks of `part(i)` for every laid-out `i` (f32; `None`: zeros), each chunk
    /// concatenated from its parts and zero padding: one buffer beside the parts (a buffer of
    /// zeros filled in place costs two on flex, whose zeros are made twice over).
    pub fn flatten(
        &self,
        mut part: impl FnMut(usize) -> Option<Tensor<2>>,
        device: &Device,
    ) -> Flat {
        let zeros = |n: usize| Tensor::zeros([n], (device, DType::F32));
        let mut pieces: Vec<Vec<Tensor<1>>> = self.chunks.iter().map(|_| Vec::new()).collect();
        for i in self.indices() {
            let place = self.place(i);
            let n = place.range().len();
            let values = part(i).map_or_else(|| zeros(n), |t| t.reshape([n]));
            pieces[place.chunk].push(values);
            let padding = n.next_multiple_of(ALIGN) - n;
            if padding > 0 {
                pieces[place.chunk].push(zeros(padding));
            }
        }
        pieces.into_iter().map(|p| Tensor::cat(p, 0)).collect()
    }

    /// `flat` with parameter `index`'s place holding `t` (f32, the parameter's shape), in place
    /// where nothing else holds its chunk.
    pub fn assign(&self, flat: &mut Flat, index: usize, t: Tensor<2>) {
        let c = self.place(index).chunk;
        let last = flat.len() - 1;
        flat.swap(c, last);
        let chunk = flat.pop().expect("a chunk per place");
        flat.push(self.assign_in(chunk, index, t));
        flat.swap(c, last);
    }

    fn assign_in(&self, chunk: Tensor<1>, index: usize, t: Tensor<2>) -> Tensor<1> {
        let range = self.place(index).range();
        chunk.slice_assign([range.clone()], t.reshape([range.len()]))
    }

    /// Parameter `index`'s values in `flat`, a view of its chunk (`None`: not laid out).
    pub fn view(&self, flat: &[Tensor<1>], index: usize) -> Option<Tensor<2>> {
        let place = (*self.places.get(index)?)?;
        Some(
            flat[place.chunk]
                .clone()
                .slice([place.range()])
                .reshape(place.dims),
        )
    }

    /// The chunks of the host's `part(i)` for every laid-out `i` (what [`FlatLayout::flatten`]
    /// makes on a device), each uploaded in one piece.
    pub fn join_host<'a>(&self, part: impl Fn(usize) -> &'a [f32], device: &Device) -> Flat {
        let mut host: Vec<Vec<f32>> = self.chunks.iter().map(|&len| vec![0.0; len]).collect();
        for i in self.indices() {
            let place = self.place(i);
            host[place.chunk][place.range()].copy_from_slice(part(i));
        }
        (host.into_iter())
            .map(|h| {
                let len = h.len();
                Tensor::from_data(TensorData::new(h, [len]), (device, DType::F32))
            })
            .collect()
    }

    /// `flat` downloaded and cut back into its parameters (`None`: not laid out).
    pub fn to_host(&self, flat: &[Tensor<1>]) -> Result<Vec<Option<Vec<f32>>>, ModelError> {
        let host: Vec<Vec<f32>> = (flat.iter())
            .map(|c| to_f32_vec(c.clone()))
            .collect::<Result<_, _>>()?;
        Ok((self.places.iter())
            .map(|p| p.map(|p| host[p.chunk][p.range()].to_vec()))
            .collect())
    }

    fn place(&self, index: usize) -> Place {
        self.places[index].expect("the parameter is laid out")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use memfit_nn::layers::host::float_tensor;

    const DIMS: [[usize; 2]; 4] = [[2, 3], [0, 0], [1, ALIGN], [3, 100]];

    fn values() -> Vec<Vec<f32>> {
        (DIMS.iter().enumerate())
            .map(|(p, d)| (0..d[0] * d[1]).map(|i| (p * 1000 + i) as f32).collect())
            .collect()
    }

    #[test]
    fn parameters_start_aligned_and_come_back_as_they_went_in() {
        let layout = FlatLayout::new(DIMS.iter().enumerate().map(|(i, d)| (i != 1).then_some(*d)));
        assert_eq!(layout.len(), 2 * ALIGN + 300usize.next_multiple_of(ALIGN));
        assert_eq!(layout.indices().collect::<Vec<_>>(), vec![0, 2, 3]);
        assert!(!layout.contains(1) && layout.contains(3) && !layout.contains(9));
        let device = Device::flex();
        let values = values();
        let part = |i: usize| Some(float_tensor(&values[i], DIMS[i], &device, DType::F32));
        let on_device = layout.flatten(part, &device);
        let uploaded = layout.join_host(|i| &values[i], &device);
        let a = to_f32_vec(on_device[0].clone()).unwrap();
        assert_eq!(
            a,
            to_f32_vec(uploaded[0].clone()).unwrap(),
            "device and host agree"
        );
        assert_eq!(a[6..ALIGN], vec![0.0; ALIGN - 6], "padding is zero");
        let back = layout.to_host(&on_device).unwrap();
        assert_eq!(back[1], None);
        for i in [0, 2, 3] {
            assert_eq!(back[i].as_ref(), Some(&values[i]));
            let view = layout.view(&uploaded, i).unwrap();
            assert_eq!(to_f32_vec(view).unwrap(), values[i]);
        }
    }

    #[test]
    fn a_chunk_ends_before_a_parameter_would_pass_the_chunk_size() {
        let big = [1, CHUNK - ALIGN];
        let layout = FlatLayout::new([Some(big), Some([1, 10]), Some([1, 10]), Some([2, CHUNK])]);
        assert_eq!(layout.chunks, vec![CHUNK, ALIGN, 2 * CHUNK]);
        let at = |i: usize| (layout.place(i).chunk, layout.place(i).start);
        assert_eq!(
            [at(0), at(1), at(2), at(3)],
            [(0, 0), (0, CHUNK - ALIGN), (1, 0), (2, 0)]
        );
        // a value assigned to a later chunk lands there, and the other chunks keep theirs
        let small = FlatLayout::new([Some([1, 10]), Some([1, CHUNK]), Some([1, 3])]);
        let device = Device::flex();
        let mut flat = small.flatten(|_| None, &device);
        small.assign(&mut flat, 2, Tensor::ones([1, 3], (&device, DType::F32)));
        assert_eq!(flat.len(), 3);
        assert_eq!(
            to_f32_vec(flat[2].clone()).unwrap()[..4],
            [1.0, 1.0, 1.0, 0.0]
        );
        assert_eq!(
            to_f32_vec(small.view(&flat, 0).unwrap()).unwrap(),
            [0.0; 10]
        );
    }
}
