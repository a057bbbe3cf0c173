//! The resources and data sources, one module per sless object type.

pub mod device;
pub mod function;
pub mod job;
pub mod namespace;
pub mod secret;
pub mod trigger;

use crate::resource::{SlessDataSource, SlessResource};
use crate::schema::Def;

/// The table of the resource (or, with `data`, the data source) `sless_{name}`.
pub fn def_of(name: &str, data: bool) -> Option<Def> {
    let def = match (name, data) {
        ("namespace", false) => namespace::NamespaceResource::default().def().clone(),
        ("function", false) => function::FunctionResource::new(false).def().clone(),
        ("service", false) => function::FunctionResource::new(true).def().clone(),
        ("trigger", false) => trigger::TriggerResource::default().def().clone(),
        ("job", false) => job::JobResource::default().def().clone(),
        ("secret", false) => secret::SecretResource::default().def().clone(),
        ("device", false) => device::DeviceResource::default().def().clone(),
        ("function", true) => function::FunctionData::default().def().clone(),
        ("namespace", true) => namespace::NamespaceData::default().def().clone(),
        _ => return None,
    };
    Some(def)
}
