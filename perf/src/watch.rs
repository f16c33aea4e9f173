//! Reading watch streams: a watch answer is one JSON event a line (chunked over HTTP/1.1, DATA
//! frames over HTTP/2), and a line may arrive split over several frames or share one with others.

use http_body_util::BodyExt as _;

/// How a watch stream stopped.
#[derive(Debug)]
pub enum StreamEnd {
    /// The server ended the body.
    Ended,
    /// The connection or stream failed.
    Failed(hyper::Error),
}

impl std::fmt::Display for StreamEnd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Ended => f.write_str("watch stream ended"),
            Self::Failed(error) => write!(f, "watch stream failed: {error}"),
        }
    }
}

/// Calls `line` with every complete line of `body` (without its `\n`), in order, as the frames
/// arrive, until the body ends or fails; returns how. A last line without `\n` is not passed on.
pub async fn for_each_line(mut body: hyper::body::Incoming, mut line: impl FnMut(&[u8])) -> StreamEnd {
    let mut buffer: Vec<u8> = Vec::new();
    loop {
        match body.frame().await {
            Some(Ok(frame)) => {
                let Ok(data) = frame.into_data() else { continue };
                buffer.extend_from_slice(&data);
                let mut start = 0;
                while let Some(end) = buffer[start..].iter().position(|b| *b == b'\n') {
                    line(&buffer[start..start + end]);
                    start += end + 1;
                }
                buffer.drain(..start);
            }
            Some(Err(error)) => return StreamEnd::Failed(error),
            None => return StreamEnd::Ended,
        }
    }
}
