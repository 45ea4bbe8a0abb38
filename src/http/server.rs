//! A small HTTP/1.1 server for fixed paths: the metrics endpoint (`GET`/`HEAD /metrics`),
//! nsqd's liveness convention (`GET /ping` answers `OK`) and readiness (`GET /ready`).

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, ALLOW, CONTENT_TYPE};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

/// A page: its content type and a function that renders its status and body on each request.
pub(crate) type Page = (
    &'static str,
    Arc<dyn Fn() -> (StatusCode, String) + Send + Sync>,
);

/// A function that answers each request (for paths whose answer depends on the query or the
/// headers).
pub(crate) type Responder = Arc<dyn Fn(&Request<Incoming>) -> Response<Full<Bytes>> + Send + Sync>;

/// Serves `pages` (path, page) on an already bound listener until `shutdown` completes:
/// `GET` and `HEAD` of a listed path answer 200 with the rendered page, other paths 404,
/// other methods 405. Connections are kept alive; each is closed after 30 s idle.
pub(crate) async fn serve(
    listener: TcpListener,
    pages: Vec<(&'static str, Page)>,
    shutdown: impl Future<Output = ()>,
) {
    let pages = Arc::new(pages);
    serve_with(
        listener,
        Arc::new(move |request| answer(&pages, request)),
        shutdown,
    )
    .await;
}

/// Serves every request with `respond` on an already bound listener until `shutdown`
/// completes. Connections are kept alive; each is closed after 30 s idle.
pub(crate) async fn serve_with(
    listener: TcpListener,
    respond: Responder,
    shutdown: impl Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    loop {
        let (stream, _) = tokio::select! {
            () = &mut shutdown => return,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    tracing::warn!(%error, "HTTP listener failed to accept.");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let respond = respond.clone();
        tokio::spawn(async move {
            let service = service_fn(move |request| {
                let respond = respond.clone();
                async move { Ok::<_, Infallible>(respond(&request)) }
            });
            let connection = http1::Builder::new()
                .keep_alive(true)
                .serve_connection(TokioIo::new(stream), service);
            // A client that keeps a connection open and idle loses it after a while.
            let _ = tokio::time::timeout(Duration::from_secs(30), connection).await;
        });
    }
}

fn answer(pages: &[(&'static str, Page)], request: &Request<Incoming>) -> Response<Full<Bytes>> {
    let text = |status: StatusCode, body: &str| {
        let mut response = Response::new(Full::new(Bytes::from(body.to_owned())));
        *response.status_mut() = status;
        response
            .headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        response
    };
    let head = request.method() == Method::HEAD;
    if request.method() != Method::GET && !head {
        let mut response = text(StatusCode::METHOD_NOT_ALLOWED, "only GET and HEAD\n");
        response
            .headers_mut()
            .insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
        return response;
    }
    let Some((_, (content_type, render))) =
        pages.iter().find(|(path, _)| *path == request.uri().path())
    else {
        let paths: Vec<&str> = pages.iter().map(|(path, _)| *path).collect();
        return text(
            StatusCode::NOT_FOUND,
            &format!("not found; try {}\n", paths.join(" or ")),
        );
    };
    let (status, body) = render();
    let length = body.len();
    let mut response = Response::new(Full::new(if head {
        Bytes::new()
    } else {
        Bytes::from(body)
    }));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    if head {
        response
            .headers_mut()
            .insert(hyper::header::CONTENT_LENGTH, HeaderValue::from(length));
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::{HttpClient, HttpClientConfig};

    #[tokio::test]
    async fn answers_get_head_ping_and_refuses_the_rest() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let metrics: Page = (
            "text/plain; version=0.0.4",
            Arc::new(|| (StatusCode::OK, "x 1\n".to_owned())),
        );
        let ping: Page = ("text/plain", Arc::new(|| (StatusCode::OK, "OK".to_owned())));
        let ready: Page = (
            "text/plain",
            Arc::new(|| (StatusCode::SERVICE_UNAVAILABLE, "not ready\n".to_owned())),
        );
        let server = tokio::spawn(serve(
            listener,
            vec![("/metrics", metrics), ("/ping", ping), ("/ready", ready)],
            async move {
                let _ = stopped.await;
            },
        ));
        let client = HttpClient::new(&HttpClientConfig::default()).unwrap();
        let url = |path: &str| format!("http://{addr}{path}").parse().unwrap();
        let get = |path: &'static str, method: Method| {
            let client = client.clone();
            async move {
                client
                    .send(method, &url(path), &[], Bytes::new())
                    .await
                    .unwrap()
            }
        };
        assert_eq!(
            get("/metrics", Method::GET).await,
            (StatusCode::OK, Bytes::from("x 1\n"))
        );
        assert_eq!(
            get("/metrics", Method::HEAD).await,
            (StatusCode::OK, Bytes::new())
        );
        assert_eq!(
            get("/ping", Method::GET).await,
            (StatusCode::OK, Bytes::from("OK"))
        );
        assert_eq!(
            get("/ready", Method::GET).await,
            (StatusCode::SERVICE_UNAVAILABLE, Bytes::from("not ready\n"))
        );
        assert_eq!(get("/other", Method::GET).await.0, StatusCode::NOT_FOUND);
        assert_eq!(
            get("/metrics", Method::POST).await.0,
            StatusCode::METHOD_NOT_ALLOWED
        );
        let _ = stop.send(());
        server.await.unwrap();
    }
}
