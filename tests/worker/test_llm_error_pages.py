"""The ``llm`` program's diagnostic when an endpoint's error is no API error (127.0.0.1, a port the OS picks).

Found by a probe against a fake endpoint: a proxy's or CDN's HTML error page (nginx's 502, Cloudflare's)
was quoted as its first 300 characters of markup, which for Cloudflare is conditional comments and
``<html class=...>`` tags and never the words "Bad gateway"; a 404 from a server with no chat
completions at that path (a base URL missing its ``/v1``) said "rejected the request (HTTP 404): 404
page not found" without the URL that was asked, the one thing a user must fix.
"""

from __future__ import annotations

import pytest

from .test_llm_faults import endpoint, program, run_once  # noqa: F401 (endpoint: a fixture)

pytestmark = pytest.mark.anyio

NGINX = (b"<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n<center><h1>502 Bad Gateway</h1></center>\r\n"
         b"<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n")
CLOUDFLARE = (b'<!DOCTYPE html>\n<!--[if lt IE 7]> <html class="no-js ie6 oldie" lang="en-US"> <![endif]-->\n'
              b'<!--[if IE 7]>    <html class="no-js ie7 oldie" lang="en-US"> <![endif]-->\n'
              b'<!--[if gt IE 8]><!--> <html class="no-js" lang="en-US"> <!--<![endif]-->\n<head>\n'
              b'<title>api.example.com | 502: Bad gateway</title>\n<meta charset="UTF-8" />\n'
              b'<style>body { font-family: sans-serif; }</style>\n</head><body><h1>Bad gateway</h1>'
              b"<p>The web server reported a bad gateway error &amp; more.</p></body></html>")
UNTITLED = b"<!doctype html><html><body><script>var x = 1;</script><h1>Service &amp; API down</h1></body></html>"


@pytest.mark.parametrize("page, said", [
    (NGINX, 'an HTML page titled "502 Bad Gateway"'),
    (CLOUDFLARE, 'an HTML page titled "api.example.com | 502: Bad gateway"'),
    (UNTITLED, "an HTML page: Service & API down"),
], ids=["nginx", "cloudflare", "untitled"])
async def test_an_html_error_page_is_quoted_by_its_title_not_its_markup(tmp_path, endpoint, page, said) -> None:
    base_url, seen, answers = endpoint
    answers.append((502, {"Content-Type": "text/html"}, page))
    result, _, _ = await run_once(tmp_path, program(base_url, max_retries=0))
    assert (result.stop_reason, result.diagnostic) == ("error", f"the model endpoint failed (HTTP 502): {said}"), result


async def test_a_404_that_is_no_api_error_names_the_url_asked(tmp_path, endpoint) -> None:
    base_url, seen, answers = endpoint
    answers.append((404, {"Content-Type": "text/plain"}, b"404 page not found"))
    result, _, _ = await run_once(tmp_path, program(base_url, max_retries=0))
    assert (result.stop_reason, result.diagnostic) == (
        "error", f"the model endpoint has no {base_url}/chat/completions (HTTP 404; is base_url, SUBAGENTS_LLM_BASE_URL, right?): "
                 "404 page not found"), result


async def test_a_404_the_api_explains_is_quoted_as_it_was(tmp_path, endpoint) -> None:
    """An API's own 404 (an unknown model) is about the request, not the URL: it keeps its words."""
    base_url, seen, answers = endpoint
    answers.append((404, {"Content-Type": "application/json"},
                    b'{"error": {"message": "The model `fake` does not exist", "code": "model_not_found"}}'))
    result, _, _ = await run_once(tmp_path, program(base_url, max_retries=0))
    assert (result.stop_reason, result.diagnostic) == (
        "error", "the model endpoint rejected the request (HTTP 404): The model `fake` does not exist"), result
