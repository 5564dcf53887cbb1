//! Checkpoints in torch.save's zip layout (the pickle of an `OrderedDict` state dict whose tensors
//! refer to storages by persistent id, one storage per entry under `data/`), written opcode by opcode
//! for the tests that read `.bin` files: `pytorch_model.bin` (bert) and `adapter_model.bin`
//! (decoder LoRA).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

use burn::tensor::{bf16, f16};
use memfit_nn::weights::LoadedTensor;

/// How a storage holds its values: torch's storage class and the bytes of each value.
#[derive(Clone, Copy, Debug)]
#[allow(dead_code)] // each test binary writes the storages it needs
pub enum Storage {
    F32,
    F16,
    BF16,
    I64,
}

impl Storage {
    fn class(self) -> &'static str {
        match self {
            Self::F32 => "FloatStorage",
            Self::F16 => "HalfStorage",
            Self::BF16 => "BFloat16Storage",
            Self::I64 => "LongStorage",
        }
    }

    fn bytes(self, values: &[f32]) -> Vec<u8> {
        let f = |x: &f32| -> Vec<u8> {
            match self {
                Self::F32 => x.to_le_bytes().to_vec(),
                Self::F16 => f16::from_f32(*x).to_le_bytes().to_vec(),
                Self::BF16 => bf16::from_f32(*x).to_le_bytes().to_vec(),
                Self::I64 => (*x as i64).to_le_bytes().to_vec(),
            }
        };
        values.iter().flat_map(f).collect()
    }
}

/// A pickle (protocol 2) built opcode by opcode, as Python's pickler writes torch.save's state dict.
#[derive(Default)]
struct Pickle(Vec<u8>);

impl Pickle {
    fn op(&mut self, code: u8) -> &mut Self {
        self.0.push(code);
        self
    }
    fn global(&mut self, module: &str, name: &str) -> &mut Self {
        self.0.extend(format!("c{module}\n{name}\n").bytes());
        self
    }
    fn str(&mut self, s: &str) -> &mut Self {
        self.op(b'X');
        self.0.extend((s.len() as u32).to_le_bytes());
        self.0.extend(s.bytes());
        self
    }
    fn int(&mut self, v: usize) -> &mut Self {
        match v {
            0..=255 => self.op(b'K').op(v as u8),
            _ => {
                self.op(b'J');
                self.0.extend((v as i32).to_le_bytes());
                self
            }
        }
    }
    fn int_tuple(&mut self, items: &[usize]) -> &mut Self {
        self.op(b'(');
        items.iter().for_each(|&v| {
            self.int(v);
        });
        self.op(b't')
    }
    /// `collections.OrderedDict()`.
    fn ordered_dict(&mut self) -> &mut Self {
        self.global("collections", "OrderedDict").op(b')').op(b'R')
    }
    /// `torch._utils._rebuild_tensor_v2(storage, offset, size, stride, False, OrderedDict())` with the
    /// storage as torch.save refers to it: `('storage', torch.<Class>, key, 'cpu', numel)`.
    fn tensor(&mut self, storage: Storage, key: &str, numel: usize, shape: &[usize]) -> &mut Self {
        let strides: Vec<usize> = (0..shape.len())
            .map(|i| shape[i + 1..].iter().product())
            .collect();
        self.global("torch._utils", "_rebuild_tensor_v2").op(b'(');
        self.op(b'(')
            .str("storage")
            .global("torch", storage.class());
        self.str(key).str("cpu").int(numel).op(b't').op(b'Q');
        self.int(0).int_tuple(shape).int_tuple(&strides);
        self.op(0x89).ordered_dict().op(b't').op(b'R')
    }
}

/// Writes `tensors` as `torch.save(model.state_dict(), path)` does (PyTorch ≥ 1.6): a zip whose
/// `pytorch_model/data.pkl` holds the state dict (with the `_metadata` attribute state dicts carry)
/// and whose `pytorch_model/data/N` hold the storages. `alias` adds names sharing another's storage,
/// as tied weights are saved.
pub fn write_bin(
    path: &Path,
    tensors: &BTreeMap<String, (Storage, LoadedTensor)>,
    alias: &[(&str, &str)],
) {
    let mut keys = BTreeMap::new();
    let mut pickle = Pickle::default();
    pickle.op(0x80).op(2).ordered_dict().op(b'(');
    for (i, (name, (storage, t))) in tensors.iter().enumerate() {
        keys.insert(name.as_str(), i);
        pickle
            .str(name)
            .tensor(*storage, &i.to_string(), t.values.len(), &t.shape);
    }
    for (name, of) in alias {
        let (storage, t) = &tensors[*of];
        let key = keys[of].to_string();
        pickle
            .str(name)
            .tensor(*storage, &key, t.values.len(), &t.shape);
    }
    pickle.op(b'u');
    pickle.op(b'}').str("_metadata").ordered_dict();
    pickle
        .op(b'(')
        .str("")
        .op(b'}')
        .str("version")
        .int(1)
        .op(b's');
    pickle.op(b'u').op(b's').op(b'b').op(b'.');

    let mut zip = zip::ZipWriter::new(std::fs::File::create(path).unwrap());
    let stored =
        zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    let mut entry = |name: &str, bytes: &[u8]| {
        zip.start_file(format!("pytorch_model/{name}"), stored)
            .unwrap();
        zip.write_all(bytes).unwrap();
    };
    entry("data.pkl", &pickle.0);
    entry("byteorder", b"little");
    for (i, (storage, t)) in tensors.values().enumerate() {
        entry(&format!("data/{i}"), &storage.bytes(&t.values));
    }
    entry("version", b"3\n");
    zip.finish().unwrap();
}
