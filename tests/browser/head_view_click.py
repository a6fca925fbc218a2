#!/usr/bin/env python3
"""`tapeformer attention --view` in headless Chromium, driven by real clicks (ctest: head_view_click).

    head_view_click.py CLI SOURCE_DIR ARTIFACTS_DIR

Trains a tiny model, writes the head view of one pair with a head masked, opens it in headless Chromium
over the DevTools protocol (--remote-debugging-pipe: no extra package, no port), and checks the page
through the browser's own input: choosing a kind, layer and head redraws that head's lines; a mouse click
on a query token leaves only its lines, one per key it weighs, the heaviest on its argmax key, with the
weights written out, and stays when the pointer leaves; a second click lets go of it; a masked
head is drawn and named as masked; the page requests nothing from the network. Keeps a screenshot as
ARTIFACTS_DIR/head_view.png. Without Chromium the case reports itself skipped (ctest's skip marker), and
fails where TAPEFORMER_REQUIRE_TOOLS is set (scripts/test.sh, which installs it).
"""
import base64
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile

SKIPPED = "TAPEFORMER-TEST-SKIPPED"
cli, source_dir, artifacts = sys.argv[1], sys.argv[2], sys.argv[3]
chromium = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)
if chromium is None:
    if os.environ.get("TAPEFORMER_REQUIRE_TOOLS"):
        sys.exit("head_view_click: chromium is not installed (scripts/install-deps.sh installs it)")
    print(f"{SKIPPED}: chromium is not installed; the head view's click test did not run")
    sys.exit(0)
signal.alarm(240)  # never hold the suite: a hung browser fails the case
tmp = tempfile.mkdtemp(prefix="tf_head_view_")
toy = os.path.join(source_dir, "data", "toy")


def run(*args):
    r = subprocess.run([cli, "--threads", "1", *args], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"head_view_click: tapeformer {' '.join(args)} failed: {r.stderr}")
    return r


model = os.path.join(tmp, "model")
run("train", "--train-src", f"{toy}/valid.src", "--train-tgt", f"{toy}/valid.tgt", "--tokenizer", "word", "--vocab-size", "0",
    "--d-model", "16", "--heads", "2", "--ffn", "32", "--layers", "1", "--max-steps", "30", "--out", model)
page = os.path.join(tmp, "view.html")
run("attention", "--model", model, "--src", "the blue men that sing watched some green queens .",
    "--tgt", "loi donon blavoi ke kantent .", "--mask-heads", "D:0:0", "--view", page)


class Browser:
    """Headless Chromium over --remote-debugging-pipe: JSON messages ended by NUL, on fds 3 (in) and 4 (out)."""

    def __init__(self):
        to_browser_r, self.to_browser = os.pipe()
        self.from_browser, from_browser_w = os.pipe()

        def fds():  # via fds above 10, so that neither end already sits on 3 or 4 (dup2 onto itself keeps close-on-exec)
            a = fcntl.fcntl(to_browser_r, fcntl.F_DUPFD, 10)
            b = fcntl.fcntl(from_browser_w, fcntl.F_DUPFD, 10)
            os.dup2(a, 3)
            os.dup2(b, 4)

        args = [chromium, "--headless", "--remote-debugging-pipe", "--disable-gpu", "--no-first-run",
                "--no-default-browser-check", "--disable-extensions", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", f"--user-data-dir={tmp}/profile", "--window-size=900,800"]
        if os.geteuid() == 0:
            args.append("--no-sandbox")  # Chromium refuses to run as root with its sandbox
        self.proc = subprocess.Popen(args, preexec_fn=fds, close_fds=False, stdout=subprocess.DEVNULL,
                                     stderr=open(f"{tmp}/chromium.log", "w"))
        os.close(to_browser_r)
        os.close(from_browser_w)
        self.buffer, self.next_id, self.events, self.session = b"", 0, [], None

    def send(self, method, params=None, session=True):
        self.next_id += 1
        message = {"id": self.next_id, "method": method, "params": params or {}}
        if session and self.session:
            message["sessionId"] = self.session
        os.write(self.to_browser, json.dumps(message).encode() + b"\0")
        while True:
            reply = self.read()
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def read(self):
        while b"\0" not in self.buffer:
            chunk = os.read(self.from_browser, 1 << 16)
            if not chunk:
                raise RuntimeError("chromium closed its pipe (see chromium.log)")
            self.buffer += chunk
        message, self.buffer = self.buffer.split(b"\0", 1)
        return json.loads(message)

    def wait_for(self, method):
        while True:
            for i, e in enumerate(self.events):
                if e.get("method") == method:
                    return self.events.pop(i)
            self.events.append(self.read())

    def js(self, expression):
        r = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        if "exceptionDetails" in r:
            raise RuntimeError(f"{expression}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def mouse(self, kind, x, y):
        params = {"type": kind, "x": x, "y": y, "button": "left" if kind != "mouseMoved" else "none"}
        if kind != "mouseMoved":
            params["clickCount"] = 1
        self.send("Input.dispatchMouseEvent", params)

    def click(self, x, y):
        self.mouse("mouseMoved", x, y)
        self.mouse("mousePressed", x, y)
        self.mouse("mouseReleased", x, y)


failures = []


def check(condition, what):
    if not condition:
        failures.append(what)
        print("FAILED:", what, file=sys.stderr)


b = Browser()
try:
    target = b.send("Target.createTarget", {"url": "about:blank"}, session=False)["targetId"]
    b.session = b.send("Target.attachToTarget", {"targetId": target, "flatten": True}, session=False)["sessionId"]
    for domain in ("Page", "Runtime", "Network"):
        b.send(f"{domain}.enable")
    b.send("Page.navigate", {"url": "file://" + page})
    b.wait_for("Page.loadEventFired")
    data = b.js("JSON.parse(document.getElementById('maps').textContent)")
    check(b.js("document.querySelectorAll('line.att').length") > 0, "the page draws lines on opening")

    # Decoder self-attention, layer 0, head 1, chosen as the page's own selectors do it.
    b.js("for (const [id, v] of [['kind', 'decoder_self'], ['layer', '0'], ['head', '1']]) {"
         " const s = document.getElementById(id); s.value = v; s.dispatchEvent(new Event('change')); }")
    weights = data["decoder_self"][0][1]  # [query][key]
    heads = b.js("[...document.querySelectorAll('line.att')].map(l => +l.dataset.head)")
    check(heads and set(heads) == {1}, f"after choosing head 1 only its lines are drawn (heads {sorted(set(heads))})")
    check(len(heads) == sum(1 for row in weights for w in row if w > 0), "a line for every weight above 0 (none for the future)")

    # A real click on query token 3: only its lines remain, pinned when the pointer leaves.
    q = 3
    box = b.js(f"(() => {{ const r = document.querySelector('text.query[data-index=\"{q}\"]').getBoundingClientRect();"
               " return [r.x + r.width / 2, r.y + r.height / 2]; })()")
    b.click(*box)
    lines = b.js("[...document.querySelectorAll('line.att')].map(l => [+l.dataset.query, +l.dataset.key, +l.dataset.weight])")
    positive = [key for key, w in enumerate(weights[q]) if w > 0]
    check(lines and all(query == q for query, _, _ in lines), "after the click every line starts at the clicked token")
    check(sorted(key for _, key, _ in lines) == positive, f"one line per key the token weighs ({len(lines)} against {len(positive)})")
    heaviest = max(lines, key=lambda line: line[2])[1] if lines else -1
    check(heaviest == max(range(len(weights[q])), key=lambda key: weights[q][key]), "the heaviest line ends at the argmax key")
    check(b.js("document.querySelectorAll('text.weight').length") == len(data["tokens"]["tgt_in"]), "the weights are written out")
    check(b.js(f"document.querySelector('text.query[data-index=\"{q}\"]').classList.contains('pinned')"), "the token is marked")
    b.mouse("mouseMoved", 5, 5)  # the pointer leaves the picture: the clicked token's lines stay
    check(b.js("document.querySelectorAll('line.att').length") == len(lines), "the clicked lines stay when the pointer leaves")
    shot = b.send("Page.captureScreenshot", {"format": "png"})["data"]
    os.makedirs(artifacts, exist_ok=True)
    with open(os.path.join(artifacts, "head_view.png"), "wb") as f:
        f.write(base64.b64decode(shot))

    b.click(*box)  # a second click lets go: the token's lines show while the pointer is on it, every line after
    check(not b.js(f"document.querySelector('text.query[data-index=\"{q}\"]').classList.contains('pinned')"),
          "a second click unmarks the token")
    b.mouse("mouseMoved", 5, 5)
    check(b.js("document.querySelectorAll('line.att').length") == len(heads), "let go, every line of the head is back")

    # The masked head D:0:0: named in the head list and the note, its lines grey.
    check("(masked)" in b.js("document.querySelector('#head option[value=\"0\"]').textContent"), "the head list marks D:0:0")
    b.js("const s = document.getElementById('head'); s.value = '0'; s.dispatchEvent(new Event('change'));")
    check(b.js("document.querySelectorAll('line.att').length") == b.js("document.querySelectorAll('line.att.masked').length") > 0,
          "every line of the masked head is drawn as masked")
    check("D:0:0" in b.js("document.getElementById('masked').textContent"), "the note names the masked head")

    requests = [e["params"]["request"]["url"] for e in b.events if e.get("method") == "Network.requestWillBeSent"]
    check(all(url.startswith("file://") for url in requests), f"the page requests nothing but itself: {requests}")
finally:
    try:
        b.send("Browser.close", session=False)
    except Exception:
        pass
    b.proc.kill()
    b.proc.wait()

if failures:
    sys.exit(f"{len(failures)} check(s) failed: " + "; ".join(failures))
print(f"head_view_click: every check passed; screenshot {os.path.join(artifacts, 'head_view.png')}")
