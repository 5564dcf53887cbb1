//! A parameter's accumulated gradient on the host: f32 values in a buffer taken over from the
//! backend when it can be (flex hands over a tensor's own buffer when nothing else holds it), so
//! that the gradient of a micro-batch never exists twice, once in autodiff's container and once
//! here; measured on bert-base b8 s128, that copy was the step's peak (DESIGN.md §3).

use burn::prelude::*;
use burn::tensor::{FloatDType, TensorData};
use memfit_nn::ModelError;

pub struct Gradient(TensorData);

impl Gradient {
    /// `n` zeros (a parameter that takes rows of gradient, or none this step).
    pub fn zeros(n: usize) -> Self {
        Self(TensorData::new(vec![0.0f32; n], [n]))
    }

    /// `grad`'s values in f32, its buffer moved out of the backend when possible.
    pub fn take(grad: Tensor<2>) -> Result<Self, ModelError> {
        let data = grad.cast(FloatDType::F32).into_data();
        data.as_slice::<f32>().map_err(|e| {
            ModelError::Io(format!("reading a gradient back from the device: {e:?}"))
        })?;
        Ok(Self(data))
    }
}

impl AsRef<[f32]> for Gradient {
    fn as_ref(&self) -> &[f32] {
        // `take` and `zeros` only build f32 data, checked there.
        self.0.as_slice().unwrap_or(&[])
    }
}

impl AsMut<[f32]> for Gradient {
    fn as_mut(&mut self) -> &mut [f32] {
        self.0.as_mut_slice().unwrap_or(&mut [])
    }
}

impl std::ops::Deref for Gradient {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        self.as_ref()
    }
}
