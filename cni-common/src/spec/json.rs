//! Decoding JSON the way the Go plugins do.
//!
//! Go's `encoding/json` matches object keys to struct fields exactly first and then
//! case-insensitively, ignores unknown keys and lets the last duplicate win. Real
//! configurations rely on this (upstream's own tests send a capability key in other case), so every plugin
//! decodes its configuration through [`from_value`], which wraps a `serde_json::Value` in a
//! deserializer that renames keys to the field names serde asks for before handing them over.
//! Errors name the path of the offending value: `ipam.ranges[0][1].subnet: invalid IP address`.

use serde::de::{self, DeserializeOwned, DeserializeSeed, IntoDeserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserializer;
use serde_json::{Map, Value};

/// Marker that a message already carries its path, so outer levels do not prefix it again.
const PATH_MARK: char = '\u{1}';

/// Decode `T` from `value` with Go's key matching. The error message names the path.
pub fn from_value<T: DeserializeOwned>(value: Value) -> Result<T, String> {
    T::deserialize(Ci { value, path: String::new() }).map_err(|e| clean(&e.to_string()))
}

/// Like [`from_value`] for a borrowed value (clones it).
pub fn from_ref<T: DeserializeOwned>(value: &Value) -> Result<T, String> {
    from_value(value.clone())
}

fn clean(msg: &str) -> String {
    msg.replace(PATH_MARK, "")
}

fn at(path: &str, e: serde_json::Error) -> serde_json::Error {
    let msg = e.to_string();
    if msg.starts_with(PATH_MARK) || path.is_empty() {
        return e;
    }
    de::Error::custom(format!("{PATH_MARK}{path}: {msg}"))
}

struct Ci {
    value: Value,
    path: String,
}

fn child(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

/// Rename keys to the field names serde expects: exact match first, then ASCII
/// case-insensitive (Go uses Unicode folding; ASCII covers every real key). Later duplicates
/// overwrite earlier ones, as in Go. A `null` member is dropped: Go leaves the field at its
/// zero value, which for us is the field's default.
fn fold_keys(map: Map<String, Value>, fields: &[&str]) -> Map<String, Value> {
    let mut out = Map::with_capacity(map.len());
    for (k, v) in map {
        if v.is_null() {
            continue;
        }
        let key = if fields.contains(&k.as_str()) {
            k
        } else if let Some(f) = fields.iter().find(|f| f.eq_ignore_ascii_case(&k)) {
            (*f).to_string()
        } else {
            k
        };
        out.insert(key, v);
    }
    out
}

/// Methods that hand the value to `serde_json::Value`'s own method of the same name (with the
/// arguments listed after the name, if any), adding the path to its errors.
macro_rules! forward_to_value {
    ($($method:ident $(($($arg:ident: $ty:ty),*))?)*) => {
        $(
            fn $method<V: Visitor<'de>>(
                self,
                $($($arg: $ty,)*)?
                visitor: V,
            ) -> Result<V::Value, Self::Error> {
                let path = self.path;
                self.value.$method($($($arg,)*)? visitor).map_err(|e| at(&path, e))
            }
        )*
    };
}

impl<'de> Deserializer<'de> for Ci {
    type Error = serde_json::Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        let path = self.path;
        match self.value {
            Value::Object(m) => visitor.visit_map(CiMap::new(m, path.clone())).map_err(|e| at(&path, e)),
            Value::Array(a) => visitor.visit_seq(CiSeq::new(a, path.clone())).map_err(|e| at(&path, e)),
            other => other.deserialize_any(visitor).map_err(|e| at(&path, e)),
        }
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        match self.value {
            Value::Null => visitor.visit_none(),
            value => visitor.visit_some(Ci { value, path: self.path }),
        }
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        let path = self.path;
        match self.value {
            Value::Object(m) => {
                visitor.visit_map(CiMap::new(fold_keys(m, fields), path.clone())).map_err(|e| at(&path, e))
            }
            // serde would fill a struct from an array by position; Go's decoder refuses.
            Value::Array(_) => Err(at(&path, de::Error::invalid_type(de::Unexpected::Seq, &"a JSON object"))),
            other => other.deserialize_struct(name, fields, visitor).map_err(|e| at(&path, e)),
        }
    }

    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        let path = self.path;
        match self.value {
            Value::Object(m) => visitor.visit_map(CiMap::new(m, path.clone())).map_err(|e| at(&path, e)),
            other => other.deserialize_map(visitor).map_err(|e| at(&path, e)),
        }
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        let path = self.path;
        match self.value {
            Value::Array(a) => visitor.visit_seq(CiSeq::new(a, path.clone())).map_err(|e| at(&path, e)),
            other => other.deserialize_seq(visitor).map_err(|e| at(&path, e)),
        }
    }

    fn deserialize_tuple<V: Visitor<'de>>(self, _len: usize, visitor: V) -> Result<V::Value, Self::Error> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _len: usize,
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        visitor.visit_unit()
    }

    forward_to_value! {
        deserialize_bool deserialize_i8 deserialize_i16 deserialize_i32 deserialize_i64
        deserialize_i128 deserialize_u8 deserialize_u16 deserialize_u32 deserialize_u64
        deserialize_u128 deserialize_f32 deserialize_f64 deserialize_char deserialize_str
        deserialize_string deserialize_bytes deserialize_byte_buf deserialize_unit
        deserialize_identifier
        deserialize_unit_struct(name: &'static str)
        deserialize_enum(name: &'static str, variants: &'static [&'static str])
    }
}

struct CiMap {
    iter: serde_json::map::IntoIter,
    value: Option<(String, Value)>,
    path: String,
}

impl CiMap {
    fn new(m: Map<String, Value>, path: String) -> Self {
        CiMap { iter: m.into_iter(), value: None, path }
    }
}

impl<'de> MapAccess<'de> for CiMap {
    type Error = serde_json::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>, Self::Error> {
        match self.iter.next() {
            Some((k, v)) => {
                let key = seed.deserialize(k.as_str().into_deserializer())?;
                self.value = Some((k, v));
                Ok(Some(key))
            }
            None => Ok(None),
        }
    }

    fn next_value_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<T::Value, Self::Error> {
        let (k, value) = self.value.take().ok_or_else(|| de::Error::custom("value requested before key"))?;
        seed.deserialize(Ci { value, path: child(&self.path, &k) })
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.iter.len())
    }
}

struct CiSeq {
    iter: std::iter::Enumerate<std::vec::IntoIter<Value>>,
    path: String,
}

impl CiSeq {
    fn new(a: Vec<Value>, path: String) -> Self {
        CiSeq { iter: a.into_iter().enumerate(), path }
    }
}

impl<'de> SeqAccess<'de> for CiSeq {
    type Error = serde_json::Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, Self::Error> {
        match self.iter.next() {
            Some((i, value)) => seed.deserialize(Ci { value, path: format!("{}[{i}]", self.path) }).map(Some),
            None => Ok(None),
        }
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.iter.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;
    use serde_json::json;

    #[derive(Deserialize, Debug, Default, PartialEq)]
    #[serde(rename_all = "camelCase")]
    struct Inner {
        #[serde(default)]
        ingress_rate: u64,
        #[serde(default)]
        ingress_burst: u64,
    }

    #[derive(Deserialize, Debug, PartialEq)]
    #[serde(rename_all = "camelCase")]
    struct Outer {
        #[serde(default)]
        is_gateway: bool,
        #[serde(default)]
        mtu: Option<u32>,
        #[serde(default)]
        shaping: Option<Inner>,
        #[serde(default)]
        list: Vec<Inner>,
        #[serde(default)]
        subnet: Option<ipnet::IpNet>,
    }

    #[test]
    fn keys_match_case_insensitively_like_go() {
        let v = json!({"IsGateway": true, "MTU": 1400, "shaPing": {"INGRESSRATE": 5, "ingressburst": 6}});
        let o: Outer = from_value(v).unwrap();
        assert!(o.is_gateway);
        assert_eq!(o.mtu, Some(1400));
        assert_eq!(o.shaping, Some(Inner { ingress_rate: 5, ingress_burst: 6 }));
    }

    #[test]
    fn exact_match_and_last_duplicate_win() {
        let v = json!({"isGateway": false, "ISGATEWAY": true});
        let o: Outer = from_value(v).unwrap();
        assert!(o.is_gateway, "the later key wins");
    }

    #[test]
    fn unknown_keys_are_ignored() {
        let v = json!({"addIf": "eth0", "mtu": 1500, "whatever": {"deep": [1, 2]}});
        let o: Outer = from_value(v).unwrap();
        assert_eq!(o.mtu, Some(1500));
    }

    #[test]
    fn errors_name_the_path() {
        let e = from_value::<Outer>(json!({"isGateway": "true"})).unwrap_err();
        assert!(e.starts_with("isGateway: invalid type: string \"true\", expected a boolean"), "{e}");
        let e = from_value::<Outer>(json!({"list": [{}, {"ingressRate": -1}]})).unwrap_err();
        assert!(e.starts_with("list[1].ingressRate: invalid value"), "{e}");
        let e = from_value::<Outer>(json!({"subnet": "10.0.0.0/33"})).unwrap_err();
        assert!(e.starts_with("subnet: "), "{e}");
        let e = from_value::<Outer>(json!({"mtu": 1.5})).unwrap_err();
        assert!(e.starts_with("mtu: invalid type: floating point"), "{e}");
        let e = from_value::<Outer>(json!("x")).unwrap_err();
        assert!(e.contains("expected struct Outer"), "{e}");
    }

    #[test]
    fn arrays_do_not_fill_structs() {
        // serde's derive accepts [5, 6] as Inner { ingress_rate: 5, ingress_burst: 6 }; Go does not.
        let e = from_value::<Outer>(json!({"shaping": [5, 6]})).unwrap_err();
        assert!(e.starts_with("shaping: invalid type: sequence, expected a JSON object"), "{e}");
        assert!(from_value::<Outer>(json!([true])).is_err());
    }

    #[test]
    fn null_is_none_for_options() {
        let o: Outer = from_value(json!({"mtu": null, "shaping": null, "list": null})).unwrap();
        assert_eq!(o.mtu, None);
        assert_eq!(o.shaping, None);
        assert!(o.list.is_empty());
    }
}
