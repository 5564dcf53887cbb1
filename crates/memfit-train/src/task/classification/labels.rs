//! The data's labels against the model's: a store's label names (or `LABEL_i` for integer labels),
//! and how its label ids map onto a classifier that already has labels (an `--init` checkpoint
//! with its head).

use super::ClsRow;
use crate::task::{RowSource, StoreRows};
use memfit_data::DataError;

/// Label names of a classification store, by id: its string labels, else `LABEL_i` up to its
/// number of labels (transformers' default names).
pub fn store_labels(store: &StoreRows) -> Result<Vec<String>, DataError> {
    store.0.label_names()
}

/// For each data label id, the model's id of that label: by name where the data names its labels,
/// by id where its labels are integers (`LABEL_i`). An error names the label that has no place;
/// `whose` says where the model's labels come from (`--init DIR`, the training data).
pub fn label_map(data: &[String], model: &[String], whose: &str) -> Result<Vec<u32>, String> {
    let integers = data
        .iter()
        .enumerate()
        .all(|(i, n)| *n == format!("LABEL_{i}"));
    data.iter()
        .enumerate()
        .map(|(i, name)| {
            let found = if integers {
                (i < model.len()).then_some(i)
            } else {
                model.iter().position(|m| m == name)
            };
            found.map(|j| j as u32).ok_or_else(|| {
                if integers {
                    format!(
                        "label {i} of the data is outside the {} labels (num_labels) of {whose}",
                        model.len()
                    )
                } else {
                    format!(
                        "label {name:?} of the data is not among the labels of {whose} ({})",
                        model.join(", ")
                    )
                }
            })
        })
        .collect()
}

/// Rows whose labels are mapped onto the model's ids.
pub struct Relabeled<'a> {
    pub rows: &'a dyn RowSource<ClsRow>,
    pub map: Vec<u32>,
}

impl RowSource<ClsRow> for Relabeled<'_> {
    fn len(&self) -> usize {
        self.rows.len()
    }
    fn row(&self, index: usize) -> Result<ClsRow, DataError> {
        let mut row = self.rows.row(index)?;
        row.label = self
            .map
            .get(row.label as usize)
            .copied()
            .ok_or_else(|| DataError::Store {
                path: "validation data".into(),
                reason: format!(
                    "row {index}: label {} is unknown to the training data",
                    row.label
                ),
            })?;
        Ok(row)
    }
    fn lengths(&self) -> Result<Vec<u32>, DataError> {
        self.rows.lengths()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn names_map_by_name_and_integers_by_id() {
        let model = names(&["negative", "positive", "neutral"]);
        let whose = "--init ckpt";
        let map = label_map(&names(&["positive", "neutral"]), &model, whose).unwrap();
        assert_eq!(map, vec![1, 2]);
        let ints = names(&["LABEL_0", "LABEL_1"]);
        assert_eq!(label_map(&ints, &model, whose).unwrap(), vec![0, 1]);
        let four = names(&["LABEL_0", "LABEL_1", "LABEL_2", "LABEL_3"]);
        let err = label_map(&four, &model, whose).unwrap_err();
        assert!(
            err.contains("label 3") && err.contains("3 labels (num_labels) of --init ckpt"),
            "{err}"
        );
        let err = label_map(&names(&["joy"]), &model, whose).unwrap_err();
        assert!(err.contains("\"joy\"") && err.contains("negative"), "{err}");
    }

    #[test]
    fn the_store_and_the_model_take_the_same_most_labels() {
        // A store memfit prepares must fit the classifier it trains.
        assert_eq!(
            memfit_data::MAX_LABELS as usize,
            memfit_nn::bert::config::MAX_NUM_LABELS
        );
    }
}
