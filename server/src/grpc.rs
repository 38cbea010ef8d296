//! `envoy.service.ratelimit.v3.RateLimitService` over tonic.
//!
//! The server is written here rather than taken from the generated
//! `RateLimitServiceServer` for one reason: the generated one decodes every
//! request with prost's codec before any code of the service sees it, and
//! decoding is where a hostile request costs memory. An empty descriptor is
//! two bytes on the wire and a `RateLimitDescriptor` of tens of bytes in
//! memory, so a request of the largest accepted size (4 MiB) made of two
//! million of them would be decoded into over a hundred megabytes before
//! [`Bounds`] refused it, once per request in flight. [`BoundedCodec`] counts descriptors and entries in the encoded
//! bytes first ([`check_encoded`]) and refuses a request past its bounds
//! with `INVALID_ARGUMENT` without decoding it; only then does prost decode.

use std::sync::Arc;
use std::task::{Context, Poll};

use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use prost::Message;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::{Body, BoxFuture, Service, StdError, http};
use tonic::server::{Grpc, NamedService, UnaryService};
use tonic::{Request, Response, Status};

use crate::service::{Bounds, RateLimitService, RequestError};

/// The gRPC service's full name, as Envoy calls it.
pub const SERVICE_NAME: &str = "envoy.service.ratelimit.v3.RateLimitService";

/// The one method's path.
const SHOULD_RATE_LIMIT: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// The gRPC face of a [`RateLimitService`]: a tonic service for
/// `tonic::transport::Server::add_service`, refusing a request of more
/// than `max_message` bytes, or past the service's [`Bounds`], before it is
/// decoded.
#[derive(Clone, Debug)]
pub struct GrpcService {
    service: Arc<RateLimitService>,
    max_message: usize,
}

impl GrpcService {
    /// Serve `service`, with messages of at most `max_message` bytes.
    pub fn new(service: Arc<RateLimitService>, max_message: usize) -> GrpcService {
        GrpcService {
            service,
            max_message,
        }
    }
}

impl NamedService for GrpcService {
    const NAME: &'static str = SERVICE_NAME;
}

/// The unary method `ShouldRateLimit`.
struct ShouldRateLimit(Arc<RateLimitService>);

impl UnaryService<RateLimitRequest> for ShouldRateLimit {
    type Response = RateLimitResponse;
    type Future = BoxFuture<Response<RateLimitResponse>, Status>;

    fn call(&mut self, request: Request<RateLimitRequest>) -> Self::Future {
        let service = Arc::clone(&self.0);
        Box::pin(async move {
            match service.should_rate_limit(request.get_ref()).await {
                Ok(response) => Ok(Response::new(response)),
                Err(error) => Err(Status::invalid_argument(error.to_string())),
            }
        })
    }
}

impl<B> Service<http::Request<B>> for GrpcService
where
    B: Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        if request.uri().path() != SHOULD_RATE_LIMIT {
            // As tonic's generated servers answer an unknown method.
            return Box::pin(async { Ok(Status::unimplemented("").into_http()) });
        }
        let codec = BoundedCodec {
            service: Arc::clone(&self.service),
        };
        let method = ShouldRateLimit(Arc::clone(&self.service));
        let max_message = self.max_message;
        Box::pin(async move {
            let mut grpc = Grpc::new(codec).apply_max_message_size_config(Some(max_message), None);
            Ok(grpc.unary(method, request).await)
        })
    }
}

/// prost's codec, with the request's descriptors and entries counted in its
/// encoded bytes before it is decoded. A request it refuses (past the
/// bounds, or not a valid encoding) is counted in the service's
/// `turnstile_rls_invalid_requests_total`, as one the service refuses.
#[derive(Clone, Debug)]
pub struct BoundedCodec {
    service: Arc<RateLimitService>,
}

impl Codec for BoundedCodec {
    type Encode = RateLimitResponse;
    type Decode = RateLimitRequest;
    type Encoder = ResponseEncoder;
    type Decoder = BoundedDecoder;

    fn encoder(&mut self) -> ResponseEncoder {
        ResponseEncoder
    }

    fn decoder(&mut self) -> BoundedDecoder {
        BoundedDecoder {
            service: Arc::clone(&self.service),
        }
    }
}

/// Encodes a response with prost.
#[derive(Debug)]
pub struct ResponseEncoder;

impl Encoder for ResponseEncoder {
    type Item = RateLimitResponse;
    type Error = Status;

    fn encode(&mut self, item: RateLimitResponse, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        item.encode(dst)
            .map_err(|error| Status::internal(error.to_string()))
    }
}

/// Checks a request's encoded bytes against the bounds, then decodes it with
/// prost.
#[derive(Debug)]
pub struct BoundedDecoder {
    service: Arc<RateLimitService>,
}

impl Decoder for BoundedDecoder {
    type Item = RateLimitRequest;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<RateLimitRequest>, Status> {
        use prost::bytes::Buf;
        // The whole message, which tonic has buffered in one `BytesMut`:
        // taken without a copy.
        let bytes = src.copy_to_bytes(src.remaining());
        if let Err(error) = check_encoded(&bytes, &self.service.bounds()) {
            self.service.metrics().invalid();
            return Err(Status::invalid_argument(error.to_string()));
        }
        // INTERNAL, as grpc-go (envoyproxy/ratelimit's) and tonic answer a
        // message they cannot decode.
        decode_request(bytes).map(Some).map_err(|error| {
            self.service.metrics().invalid();
            Status::internal(error.to_string())
        })
    }
}

/// Decode a `RateLimitRequest`, taking a string that is not UTF-8 (a
/// domain, an entry's key or value) with each invalid sequence replaced by
/// U+FFFD instead of refusing the whole request.
///
/// Envoy fills a descriptor's value from a request header as it came, and a
/// header may carry bytes above 0x7F that are not UTF-8; C++ protobuf sends
/// such a string as it is. Refused (prost refuses it, as Go's protobuf does
/// in envoyproxy/ratelimit), the call would fail, and Envoy admits a
/// request whose rate-limit call failed unless told otherwise
/// (`failure_mode_deny`): one byte in one header would skip every limit of
/// the request. Values that differ only in their invalid bytes share a
/// count: a stricter limit for them, never a looser one. A valid request is
/// decoded once, as before; only one that fails is decoded again.
///
/// # Errors
///
/// prost's, for bytes that are not a `RateLimitRequest` even so.
pub fn decode_request(bytes: prost::bytes::Bytes) -> Result<RateLimitRequest, prost::DecodeError> {
    match RateLimitRequest::decode(bytes.clone()) {
        Ok(request) => Ok(request),
        Err(error) => lenient::Request::decode(bytes)
            .map(lenient::Request::into_request)
            // Not a request even with its strings as bytes: prost's first
            // answer, which names the field.
            .map_err(|_| error),
    }
}

/// `RateLimitRequest` with its strings as bytes: the same wire format
/// (strings and bytes are both length-delimited), decoded whatever they
/// hold.
mod lenient {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
        Entry as PbEntry, RateLimitOverride,
    };
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
    use envoy_types::pb::google::protobuf::UInt64Value;

    /// `envoy.service.ratelimit.v3.RateLimitRequest`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub(super) struct Request {
        #[prost(bytes = "vec", tag = "1")]
        domain: Vec<u8>,
        #[prost(message, repeated, tag = "2")]
        descriptors: Vec<Descriptor>,
        #[prost(uint32, tag = "3")]
        hits_addend: u32,
    }

    /// `envoy.extensions.common.ratelimit.v3.RateLimitDescriptor`.
    #[derive(Clone, PartialEq, prost::Message)]
    struct Descriptor {
        #[prost(message, repeated, tag = "1")]
        entries: Vec<Entry>,
        #[prost(message, optional, tag = "2")]
        limit: Option<RateLimitOverride>,
        #[prost(message, optional, tag = "3")]
        hits_addend: Option<UInt64Value>,
        #[prost(bool, tag = "4")]
        is_negative_hits: bool,
    }

    /// `RateLimitDescriptor.Entry`.
    #[derive(Clone, PartialEq, prost::Message)]
    struct Entry {
        #[prost(bytes = "vec", tag = "1")]
        key: Vec<u8>,
        #[prost(bytes = "vec", tag = "2")]
        value: Vec<u8>,
    }

    fn text(bytes: Vec<u8>) -> String {
        String::from_utf8(bytes)
            .unwrap_or_else(|invalid| String::from_utf8_lossy(invalid.as_bytes()).into_owned())
    }

    impl Request {
        pub(super) fn into_request(self) -> RateLimitRequest {
            RateLimitRequest {
                domain: text(self.domain),
                descriptors: self
                    .descriptors
                    .into_iter()
                    .map(|d| RateLimitDescriptor {
                        entries: d
                            .entries
                            .into_iter()
                            .map(|e| PbEntry {
                                key: text(e.key),
                                value: text(e.value),
                            })
                            .collect(),
                        limit: d.limit,
                        hits_addend: d.hits_addend,
                        is_negative_hits: d.is_negative_hits,
                    })
                    .collect(),
                hits_addend: self.hits_addend,
            }
        }
    }

    #[cfg(test)]
    pub(super) fn entry(key: &[u8], value: &[u8]) -> Vec<u8> {
        use prost::Message;
        Request {
            domain: b"d".to_vec(),
            descriptors: vec![
                Descriptor {
                    entries: vec![Entry {
                        key: key.to_vec(),
                        value: value.to_vec(),
                    }],
                    ..Descriptor::default()
                },
                Descriptor {
                    entries: vec![Entry {
                        key: b"ip".to_vec(),
                        value: b"10.0.0.1".to_vec(),
                    }],
                    ..Descriptor::default()
                },
            ],
            hits_addend: 0,
        }
        .encode_to_vec()
    }
}

/// Count a `RateLimitRequest`'s descriptors, and each descriptor's entries,
/// in its protobuf encoding, without decoding it: a request past `bounds`
/// in either is refused as [`RateLimitService::should_rate_limit`] would
/// refuse it decoded (the same [`RequestError`], counts included). Bytes
/// that are not a valid encoding are left to the decoder to refuse: this
/// only counts.
///
/// # Errors
///
/// [`RequestError::TooManyDescriptors`] or [`RequestError::TooManyEntries`].
pub fn check_encoded(bytes: &[u8], bounds: &Bounds) -> Result<(), RequestError> {
    // `RateLimitRequest.descriptors` is field 2; `RateLimitDescriptor.entries`
    // field 1; both length-delimited.
    let mut descriptors = 0;
    let mut first_over = None;
    for (field, value) in Fields(bytes) {
        if field != (2, LEN) {
            continue;
        }
        let entries = Fields(value).filter(|(f, _)| *f == (1, LEN)).count();
        if entries > bounds.max_entries && first_over.is_none() {
            first_over = Some((descriptors, entries));
        }
        descriptors += 1;
    }
    if descriptors > bounds.max_descriptors {
        return Err(RequestError::TooManyDescriptors {
            count: descriptors,
            max: bounds.max_descriptors,
        });
    }
    match first_over {
        Some((descriptor, count)) => Err(RequestError::TooManyEntries {
            descriptor,
            count,
            max: bounds.max_entries,
        }),
        None => Ok(()),
    }
}

/// The wire type of a length-delimited field.
const LEN: u8 = 2;

/// The fields of one protobuf message: `((number, wire type), payload)`,
/// the payload of a length-delimited field its bytes (other fields' payloads
/// are skipped, given as empty). Stops at the first malformed byte.
struct Fields<'a>(&'a [u8]);

impl<'a> Iterator for Fields<'a> {
    type Item = ((u64, u8), &'a [u8]);

    fn next(&mut self) -> Option<Self::Item> {
        let key = varint(&mut self.0)?;
        let wire = (key & 7) as u8;
        let number = key >> 3;
        let payload: &[u8] = match wire {
            // VARINT
            0 => {
                varint(&mut self.0)?;
                &[]
            }
            // I64, I32
            1 | 5 => {
                let size = if wire == 1 { 8 } else { 4 };
                self.0 = self.0.get(size..)?;
                &[]
            }
            LEN => {
                let length = usize::try_from(varint(&mut self.0)?).ok()?;
                let (payload, rest) = self.0.split_at_checked(length)?;
                self.0 = rest;
                payload
            }
            // A group: not in these messages, but the decoder skips an
            // unknown one and decodes what follows, so it is skipped here
            // too and the fields after it are counted (stopping here let
            // millions of descriptors behind an empty group through).
            START_GROUP => {
                skip_group(&mut self.0, number, 0)?;
                &[]
            }
            // An end of group with no start, or no wire type: malformed.
            _ => return None,
        };
        Some(((number, wire), payload))
    }
}

/// The wire type that starts a group.
const START_GROUP: u8 = 3;
/// The wire type that ends one.
const END_GROUP: u8 = 4;
/// Groups nested deeper are malformed here; the decoder's own limit on
/// nesting (prost's recursion limit) is 100.
const MAX_GROUP_DEPTH: u32 = 100;

/// Skip the rest of group `number` (its start already read), nested groups
/// included, as the decoder skips an unknown one. `None` when malformed.
fn skip_group(bytes: &mut &[u8], number: u64, depth: u32) -> Option<()> {
    if depth >= MAX_GROUP_DEPTH {
        return None;
    }
    loop {
        let key = varint(bytes)?;
        let (wire, inner) = ((key & 7) as u8, key >> 3);
        match wire {
            0 => {
                varint(bytes)?;
            }
            1 | 5 => {
                let size = if wire == 1 { 8 } else { 4 };
                *bytes = bytes.get(size..)?;
            }
            LEN => {
                let length = usize::try_from(varint(bytes)?).ok()?;
                *bytes = bytes.get(length..)?;
            }
            START_GROUP => skip_group(bytes, inner, depth + 1)?,
            END_GROUP if inner == number => return Some(()),
            _ => return None,
        }
    }
}

/// Read a base-128 varint off the front of `bytes`.
fn varint(bytes: &mut &[u8]) -> Option<u64> {
    let mut value = 0u64;
    for i in 0..10 {
        let (&byte, rest) = bytes.split_first()?;
        *bytes = rest;
        value |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return Some(value);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A group (absent from these messages, skipped by the decoder) hides
    /// nothing after it: 2,000 descriptors behind an empty group of an
    /// unknown field, at the top and inside a descriptor, are counted as
    /// the decoder would decode them. The count stopped at the group, and a
    /// request of millions of descriptors was decoded whole.
    #[test]
    fn descriptors_behind_a_group_are_counted() {
        let bounds = Bounds::default();
        // Domain "d", then field 15 as an empty group (start 0x7b, end 0x7c).
        let mut bytes = vec![0x0a, 0x01, b'd', 0x7b, 0x7c];
        for _ in 0..2_000 {
            bytes.extend_from_slice(&[0x12, 0x00]);
        }
        let decoded = RateLimitRequest::decode(&bytes[..]).unwrap();
        assert_eq!(decoded.descriptors.len(), 2_000);
        assert!(matches!(
            check_encoded(&bytes, &bounds),
            Err(RequestError::TooManyDescriptors { count: 2_000, .. })
        ));
        // Nested groups, then the descriptors.
        let mut nested = vec![
            0x0a, 0x01, b'd', 0x7b, 0x83, 0x01, 0x08, 0x01, 0x84, 0x01, 0x7c,
        ];
        nested.extend_from_slice(&bytes[5..]);
        assert_eq!(
            RateLimitRequest::decode(&nested[..])
                .unwrap()
                .descriptors
                .len(),
            2_000
        );
        assert!(check_encoded(&nested, &bounds).is_err());
        // Entries behind a group inside one descriptor.
        let mut inner = vec![0x7b, 0x7c];
        for _ in 0..1_000 {
            inner.extend_from_slice(&[0x0a, 0x00]);
        }
        let mut one = vec![0x0a, 0x01, b'd', 0x12];
        one.extend_from_slice(&prost_len(inner.len()));
        one.extend_from_slice(&inner);
        let decoded = RateLimitRequest::decode(&one[..]).unwrap();
        assert_eq!(decoded.descriptors[0].entries.len(), 1_000);
        assert!(matches!(
            check_encoded(&one, &bounds),
            Err(RequestError::TooManyEntries { count: 1_000, .. })
        ));
    }

    /// `length` as a protobuf varint.
    fn prost_len(mut length: usize) -> Vec<u8> {
        let mut out = Vec::new();
        loop {
            let byte = (length & 0x7f) as u8;
            length >>= 7;
            if length == 0 {
                out.push(byte);
                return out;
            }
            out.push(byte | 0x80);
        }
    }
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
        Entry, RateLimitOverride,
    };
    use envoy_types::pb::google::protobuf::UInt64Value;

    fn descriptor(entries: usize) -> RateLimitDescriptor {
        RateLimitDescriptor {
            entries: (0..entries)
                .map(|i| Entry {
                    key: format!("k{i}"),
                    value: format!("v{i}"),
                })
                .collect(),
            limit: Some(RateLimitOverride {
                requests_per_unit: 300,
                unit: 2,
            }),
            hits_addend: Some(UInt64Value { value: 7 }),
            is_negative_hits: false,
        }
    }

    fn encoded(descriptors: Vec<RateLimitDescriptor>) -> Vec<u8> {
        RateLimitRequest {
            domain: "edge".to_string(),
            descriptors,
            hits_addend: 3,
        }
        .encode_to_vec()
    }

    /// The counts in the bytes are the decoded request's, so the check
    /// answers as the check on the decoded request does.
    #[test]
    fn the_encoded_counts_are_the_decoded_ones() {
        let bounds = Bounds::default();
        for (descriptors, entries) in [(1, 1), (64, 16), (65, 1), (3, 17), (0, 0), (200, 40)] {
            let mut list: Vec<_> = (0..descriptors).map(|_| descriptor(1)).collect();
            if let Some(last) = list.last_mut() {
                *last = descriptor(entries);
            }
            let bytes = encoded(list);
            let expected = if descriptors > bounds.max_descriptors {
                Err(RequestError::TooManyDescriptors {
                    count: descriptors,
                    max: bounds.max_descriptors,
                })
            } else if entries > bounds.max_entries {
                Err(RequestError::TooManyEntries {
                    descriptor: descriptors - 1,
                    count: entries,
                    max: bounds.max_entries,
                })
            } else {
                Ok(())
            };
            assert_eq!(
                check_encoded(&bytes, &bounds),
                expected,
                "{descriptors} x {entries}"
            );
        }
    }

    /// Two million empty descriptors (two bytes each) are counted, not
    /// decoded.
    #[test]
    fn empty_descriptors_by_the_million_are_refused_from_their_bytes() {
        let mut bytes = encoded(Vec::new());
        for _ in 0..2_000_000 {
            bytes.extend_from_slice(&[0x12, 0x00]);
        }
        assert_eq!(
            check_encoded(&bytes, &Bounds::default()),
            Err(RequestError::TooManyDescriptors {
                count: 2_000_000,
                max: 64
            })
        );
        // And a descriptor of a million empty entries.
        let mut inner = Vec::new();
        for _ in 0..1_000_000 {
            inner.extend_from_slice(&[0x0a, 0x00]);
        }
        let mut bytes = encoded(Vec::new());
        bytes.push(0x12);
        let mut length = inner.len() as u64;
        while length >= 0x80 {
            bytes.push((length as u8) | 0x80);
            length >>= 7;
        }
        bytes.push(length as u8);
        bytes.extend_from_slice(&inner);
        assert_eq!(
            check_encoded(&bytes, &Bounds::default()),
            Err(RequestError::TooManyEntries {
                descriptor: 0,
                count: 1_000_000,
                max: 16
            })
        );
    }

    /// Malformed bytes are not this check's to refuse: counting stops, and
    /// the decoder reports them.
    #[test]
    fn a_value_that_is_not_utf8_is_decoded_with_replacement_characters() {
        let bytes = lenient::entry(b"api_key", b"vic\xfftim");
        assert!(
            RateLimitRequest::decode(&bytes[..]).is_err(),
            "prost refuses it"
        );
        let request = decode_request(bytes.into()).expect("decoded");
        assert_eq!(request.domain, "d");
        assert_eq!(request.descriptors.len(), 2);
        assert_eq!(request.descriptors[0].entries[0].key, "api_key");
        assert_eq!(request.descriptors[0].entries[0].value, "vic\u{fffd}tim");
        assert_eq!(request.descriptors[1].entries[0].value, "10.0.0.1");
        // Valid ones decode as prost decodes them.
        let valid = lenient::entry(b"api_key", "vic\u{e9}tim".as_bytes());
        assert_eq!(
            decode_request(valid.clone().into()).expect("decoded"),
            RateLimitRequest::decode(&valid[..]).expect("valid")
        );
        // Bytes that are no request at all are still refused.
        assert!(decode_request(vec![0x0a, 0x05, b'a'].into()).is_err());
    }

    #[test]
    fn malformed_bytes_are_left_to_the_decoder() {
        let bounds = Bounds::default();
        for bytes in [
            &[0x12][..],
            &[0x12, 0x05, 0x00],
            &[0xff; 11],
            &[0x0b],
            &[
                0x12, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01,
            ],
        ] {
            assert_eq!(check_encoded(bytes, &bounds), Ok(()), "{bytes:?}");
            assert!(RateLimitRequest::decode(bytes).is_err(), "{bytes:?}");
        }
    }
}
