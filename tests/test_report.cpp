// tapeformer report (report.h): the page of a tiny trained run holds every section with its charts and
// loads nothing; sections without data say so; per-layer gradient norms in metrics.jsonl add up to the
// global norm. The [browser] case renders the page in headless Chromium (reported as skipped when it is absent).
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <chrono>
#include <thread>

#include "tapeformer/teach/report.h"
#include "tapeformer/teach/svg.h"
#include "helpers.h"

using namespace tf_test;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

std::size_t count(const std::string& text, const std::string& what) {
    std::size_t n = 0;
    for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + what.size())) ++n;
    return n;
}

// `tapeformer --threads 1 <args>`; returns the exit status, stderr into *err.
int run_status(const TempDir& tmp, const std::string& args, std::string* err = nullptr) {
    const std::string err_path = tmp / "cli.stderr";
    const std::string command = shell_quote(TF_CLI) + " --threads 1 " + args + " </dev/null >/dev/null 2>" + shell_quote(err_path);
    const int raw = std::system(command.c_str());
    if (err) *err = read_all(err_path);
    return raw != -1 && WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
}

// A 1+1-layer model trained 30 steps on 200 toy pairs with validation, heads.jsonl and a pruning curve in
// DIR/prune.json: every section of the report has its data. Returns DIR.
std::string trained_run(const TempDir& tmp) {
    const std::string toy = std::string(TF_SOURCE_DIR) + "/data/toy/";
    auto head = [&](const std::string& name, std::size_t n) {
        auto lines = split_lines(read_all(toy + name));
        lines.resize(n);
        return write_file(tmp, name, join_lines(lines));
    };
    const std::string tsrc = head("train.src", 200), ttgt = head("train.tgt", 200);
    const std::string vsrc = head("valid.src", 20), vtgt = head("valid.tgt", 20);
    const std::string dir = tmp / "run";
    std::string err;
    REQUIRE(run_status(tmp, "train --train-src " + shell_quote(tsrc) + " --train-tgt " + shell_quote(ttgt) + " --valid-src " +
                             shell_quote(vsrc) + " --valid-tgt " + shell_quote(vtgt) +
                             " --tokenizer word --vocab-size 0 --d-model 16 --heads 2 --ffn 32 --layers 1 --batch-tokens 400"
                             " --max-len 40 --warmup 10 --max-steps 30 --log-every 5 --valid-every 15 --log-heads-every 10"
                             " --out " + shell_quote(dir),
                     &err) == 0);
    REQUIRE(run_status(tmp, "heads prune --model " + shell_quote(dir) + " --src " + shell_quote(vsrc) + " --ref " + shell_quote(vtgt) +
                             " --order random --step 50% --json " + shell_quote(dir + "/prune.json"),
                     &err) == 0);
    return dir;
}

// The chart ids a report of trained_run() must hold (svg id="..."), at least one each.
const char* const kCharts[] = {"chart-loss", "chart-perplexity", "chart-learning-rate", "chart-bleu", "chart-schedule",
                               "chart-grad-norms", "chart-grad-norm-total", "chart-head-importance-step10",
                               "chart-head-importance-step30", "chart-head-entropy-step20", "chart-pruning",
                               "chart-attention-s1-E-0-0", "chart-attention-s3-A-0-1", "chart-positional",
                               "chart-mask-padding", "chart-mask-causal", "chart-mask-causal-padding",
                               "chart-label-smoothing", "chart-label-smoothing-row"};

// What must hold of the page (as written, or as a browser parsed it): every section once, drawn, every chart.
void check_page(const std::string& html) {
    for (const tf::ReportSection& s : tf::report_sections()) {
        INFO("section " << s.id);
        CHECK(count(html, std::string("<section id=\"") + s.id + "\"") == 1);
        CHECK(count(html, std::string("<section id=\"") + s.id + "\" data-state=\"drawn\"") == 1);
    }
    CHECK(count(html, "<section") == tf::report_sections().size());
    CHECK(count(html, "</section>") == tf::report_sections().size());  // none swallowed another
    for (const char* id : kCharts) {
        INFO("chart " << id);
        CHECK(count(html, std::string("id=\"") + id + "\"") == 1);
    }
    CHECK(count(html, "class=\"missing\"") == 0);
}

}  // namespace

TEST_CASE("report: every section is drawn from a run's files, nothing is fetched, the file is written atomically",
          "[report]") {
    TempDir tmp("report");
    const std::string dir = trained_run(tmp);
    std::string err;
    REQUIRE(run_status(tmp, "report --model " + shell_quote(dir), &err) == 0);
    CHECK(err.find("wrote " + dir + "/report.html") != std::string::npos);
    const std::string html = read_all(dir + "/report.html");
    check_page(html);
    // Self-contained: no script, no stylesheet or image link, no address but the SVG namespace; the CSP
    // forbids loading anything.
    CHECK(count(html, "<script") == 0);
    CHECK(count(html, "<link") == 0);
    CHECK(count(html, "<img") == 0);
    CHECK(count(html, "url(") == 0);
    CHECK(count(html, "http") == count(html, "http://www.w3.org/2000/svg") + count(html, "http-equiv"));
    CHECK(count(html, "content=\"default-src 'none'; style-src 'unsafe-inline'\"") == 1);
    // The attention maps are teacher-forced with the references: the first validation sentence is in the page.
    const std::string first_src = split_lines(read_all(tmp / "valid.src")).at(0);
    CHECK(html.find(tf::xml_escape(first_src)) != std::string::npos);
    // The label-smoothed target: the right token gets 1 − ε + ε/V (ε = 0.1, the default), read off the loss's backward.
    CHECK(html.find("nats per token") != std::string::npos);
    // No temporary file left beside it.
    for (const auto& e : fs::directory_iterator(dir)) CHECK(e.path().filename().string().find(".tmp.") == std::string::npos);

    // The padding mask is drawn for sentences of different lengths, even when the first ones (those of the
    // attention maps) are all of one length, as in a copy task: some keys of the batch are hidden.
    tf::ReportOptions same_length;
    same_length.src = write_file(tmp, "same.src", join_lines({"a b c", "b c a", "c a b", "a b", "a"}));
    const std::string masks = tf::training_report_html(dir, same_length);
    const std::size_t pad = masks.find("id=\"chart-mask-padding\"");
    REQUIRE(pad != std::string::npos);
    const std::string pad_svg = masks.substr(pad, masks.find("</svg>", pad) - pad);
    CHECK(pad_svg.find("B 3, S 4") != std::string::npos);  // "a b c", "a b", "a" and their </s>
    CHECK(count(pad_svg, "−∞ (hidden)") == 3);              // 1 pad key in the second sentence, 2 in the third

    // --out elsewhere, and the library gives the same page.
    REQUIRE(run_status(tmp, "report --model " + shell_quote(dir) + " --out " + shell_quote(tmp / "r.html")) == 0);
    CHECK(read_all(tmp / "r.html") == tf::training_report_html(dir));
}

TEST_CASE("report: training logs per-layer gradient norms whose squares add up to the global norm", "[report]") {
    TempDir tmp("report");
    const std::string dir = trained_run(tmp);
    int lines = 0;
    for (const std::string& line : split_lines(read_all(dir + "/metrics.jsonl"))) {
        const json j = json::parse(line);
        if (j.at("type") != "train") continue;
        ++lines;
        INFO("step " << j.at("step"));
        REQUIRE(j.contains("layer_grad_norms"));
        double sum = 0;
        std::vector<std::string> names;
        for (const json& e : j.at("layer_grad_norms")) {
            names.push_back(e.at(0).get<std::string>());
            sum += std::pow(e.at(1).get<double>(), 2);
        }
        // Every layer and module once, in parameter order; together all the parameters (before clipping).
        CHECK(names == std::vector<std::string>{"src_embed", "tgt_embed", "encoder.layers.0", "decoder.layers.0", "generator"});
        CHECK(std::sqrt(sum) == Approx(j.at("grad_norm").get<double>()).epsilon(1e-4));
    }
    CHECK(lines == 6);  // steps 5, 10, ..., 30
}

TEST_CASE("report: a run with --cooldown names it beside the schedule and says where its curve ends", "[report]") {
    TempDir tmp("report-cooldown");
    const std::string toy = std::string(TF_SOURCE_DIR) + "/data/toy/";
    const std::string dir = tmp / "run";
    std::string err;
    REQUIRE(run_status(tmp, "train --train-src " + shell_quote(toy + "valid.src") + " --train-tgt " + shell_quote(toy + "valid.tgt") +
                             " --tokenizer word --vocab-size 0 --d-model 16 --heads 2 --ffn 32 --layers 1 --batch-tokens 400"
                             " --warmup 2 --max-steps 12 --cooldown 0.25 --log-every 1 --out " + shell_quote(dir),
                     &err) == 0);
    const std::string html = tf::training_report_html(dir);
    CHECK(html.find("warmup 2, cooldown 0.25)") != std::string::npos);  // the settings row
    CHECK(html.find("Over the run's last 25% the rate falls linearly to 0 (--cooldown)") != std::string::npos);
    CHECK(html.find("end at step 12") != std::string::npos);
    CHECK(count(html, "<section id=\"schedule\" data-state=\"drawn\"") == 1);
}

TEST_CASE("report: sections without data stay and say what is missing, bad input is one line and a non-zero exit",
          "[report]") {
    TempDir tmp("report");
    // Only a training log, of an older run without per-layer norms or validation: no model, no run.json.
    const std::string dir = tmp / "log_only";
    fs::create_directories(dir);
    write_all(dir + "/metrics.jsonl",
              "{\"type\":\"train\",\"step\":10,\"loss\":3.0,\"nll\":2.9,\"ppl\":18.2,\"lr\":0.001,\"grad_norm\":1.5}\n"
              "{\"type\":\"train\",\"step\":20,\"loss\":2.0,\"nll\":1.9,\"ppl\":6.7,\"lr\":0.002,\"grad_norm\":1.1}\n"
              "{\"type\":\"train\",\"step\":30,\"lo");  // cut short by a crash: skipped
    const std::string html = tf::training_report_html(dir);
    for (const tf::ReportSection& s : tf::report_sections()) CHECK(count(html, std::string("<section id=\"") + s.id + "\"") == 1);
    for (const char* drawn : {"loss", "perplexity", "learning-rate"})
        CHECK(count(html, std::string("<section id=\"") + drawn + "\" data-state=\"drawn\"") == 1);
    for (const char* empty : {"bleu", "schedule", "grad-norms", "head-importance", "head-entropy", "pruning", "attention",
                              "positional", "masks", "label-smoothing"})
        CHECK(count(html, std::string("<section id=\"") + empty + "\" data-state=\"missing\"") == 1);
    CHECK(html.find("train with --log-heads-every N") != std::string::npos);
    // A heads.jsonl whose head names are malformed: that section says so, the page is still written.
    write_all(dir + "/heads.jsonl", "{\"step\":10,\"heads\":[{\"head\":\"E:x:y\",\"importance\":1}]}\n[1,2]\n");
    const std::string bad_heads = tf::training_report_html(dir);
    CHECK(bad_heads.find("could not draw this section") != std::string::npos);
    CHECK(count(bad_heads, "<section id=\"loss\" data-state=\"drawn\"") == 1);
    std::filesystem::remove(dir + "/heads.jsonl");
    CHECK(html.find("do not log them") != std::string::npos);
    CHECK(html.find("tapeformer heads prune") != std::string::npos);

    std::string err;
    CHECK(run_status(tmp, "report --model " + shell_quote(tmp / "nowhere"), &err) == 1);
    CHECK(split_lines(err).size() == 1);
    CHECK(err.find("is not a directory") != std::string::npos);
    fs::create_directories(tmp / "empty");
    CHECK(run_status(tmp, "report --model " + shell_quote(tmp / "empty"), &err) == 1);
    CHECK(err.find("holds none of run.json") != std::string::npos);
    write_all(tmp / "bad.json", "{\"order\": \"random\"}");
    CHECK(run_status(tmp, "report --model " + shell_quote(dir) + " --prune " + shell_quote(tmp / "bad.json"), &err) == 1);
    CHECK(err.find("no \"models\" list") != std::string::npos);
    CHECK(run_status(tmp, "report --model " + shell_quote(dir) + " --out " + shell_quote(tmp / "no/such/dir/r.html"), &err) != 0);
    CHECK(split_lines(err).size() == 1);
}

TEST_CASE("report names each metrics.jsonl line it leaves out (file:line and what is wrong) and a metrics.jsonl that "
          "is a directory", "[report]") {
    TempDir tmp("report_lines");
    const std::string dir = tmp / "run";
    fs::create_directories(dir);
    const std::string good = "{\"type\":\"train\",\"step\":10,\"loss\":3.0,\"nll\":2.9,\"ppl\":18.2,\"lr\":0.001}\n";
    write_all(dir + "/metrics.jsonl",
              good +                                                                  // line 1: kept
              "{\"type\":\"train\",\"step\":20,\"loss\":null,\"nll\":1.9,\"lr\":0.002}\n"   // 2: NaN written as null
              "{\"type\":\"train\",\"step\":\"30\",\"loss\":2.0,\"nll\":1.9,\"lr\":0.002}\n"  // 3: step as text
              "{\"type\":\"train\",\"step\":40,\"loss\":\"2.0\",\"nll\":1.9}\n"              // 4: loss as text
              "{\"type\":\"tarin\",\"step\":50,\"loss\":2.0}\n"                                 // 5: unknown type
              "[1, 2]\n"                                                                        // 6: not an object
              "{\"type\":\"train\",\"step\":60,\"lo");                                      // 7: cut short
    const std::string path = dir + "/metrics.jsonl";
    std::vector<std::string> problems;
    const std::string html = tf::training_report_html(dir, {}, &problems);
    const std::vector<std::string> expected = {
        path + ":2: \"loss\" is null (NaN or infinite when it was written); line left out",
        path + ":3: \"step\" is \"30\", expected a non-negative integer; line left out",
        path + ":4: \"loss\" is string \"2.0\", expected a number; line left out",
        path + ":5: unknown type \"tarin\" (expected \"train\" or \"valid\"); line left out",
        path + ":6: not a JSON object; line left out",
        path + ":7: not valid JSON (a line cut short?); line left out"};
    CHECK(problems == expected);
    for (const std::string& p : expected) CHECK(html.find(tf::xml_escape(p)) != std::string::npos);
    CHECK(count(html, "<section id=\"loss\" data-state=\"drawn\"") == 1);  // line 1 is still drawn

    // The command prints them as notes and still writes the page.
    std::string err;
    CHECK(run_status(tmp, "report --model " + shell_quote(dir), &err) == 0);
    CHECK_THAT(err, Catch::Contains("tapeformer: note: " + expected[0]));
    CHECK_THAT(err, Catch::Contains("and 1 more lines left out"));

    // A directory named metrics.jsonl is named as such, not read as a log without training lines.
    fs::remove(path);
    fs::create_directories(path);
    problems.clear();
    const std::string dir_html = tf::training_report_html(dir, {}, &problems);
    CHECK(problems == std::vector<std::string>{path + " is a directory, not a file"});
    CHECK(dir_html.find("has no training lines") == std::string::npos);
    CHECK(dir_html.find(tf::xml_escape(path + " is a directory, not a file")) != std::string::npos);
}

// ---- in a browser ----------------------------------------------------------------------------------------

namespace {

// An HTTP proxy that records the first line of every request it is sent and answers none (it closes the
// connection). Chromium started with --proxy-server pointing here sends every http, https (CONNECT) and
// ws request here, whatever host it names, loopback included: what arrives is every request the page made.
class RequestRecorder {
public:
    RequestRecorder() {
        fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
        REQUIRE(fd_ >= 0);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        a.sin_port = 0;
        REQUIRE(::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
        REQUIRE(::listen(fd_, 16) == 0);
        socklen_t len = sizeof a;
        REQUIRE(::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) == 0);
        port_ = ntohs(a.sin_port);
        thread_ = std::thread([this] { serve(); });
    }
    ~RequestRecorder() {
        stop_ = true;
        thread_.join();
        ::close(fd_);
    }
    int port() const { return port_; }
    // Both wait until every connection made so far has been read, so that a request of a browser that has
    // exited is neither missed nor counted in the next phase (a connection waits in the listen queue until
    // serve() takes it, which under load can be after the browser has exited).
    std::vector<std::string> requests() {
        settle();
        std::lock_guard<std::mutex> lock(mu_);
        return requests_;
    }
    void clear() {
        settle();
        std::lock_guard<std::mutex> lock(mu_);
        requests_.clear();
    }

private:
    void settle() {
        for (int i = 0; i < 400; ++i) {  // at most 20 s
            pollfd p{fd_, POLLIN, 0};
            if (!busy_ && ::poll(&p, 1, 0) == 0) return;  // none being read, none waiting
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
    }
    void serve() {
        while (!stop_) {
            pollfd p{fd_, POLLIN, 0};
            if (::poll(&p, 1, 50) <= 0) continue;
            busy_ = true;  // before accept: until then the connection is in the listen queue, which settle() sees
            const int c = ::accept(fd_, nullptr, nullptr);
            if (c < 0) {
                busy_ = false;
                continue;
            }
            std::string got;
            char buf[2048];
            pollfd q{c, POLLIN, 0};
            while (got.find('\n') == std::string::npos && ::poll(&q, 1, 2000) > 0) {
                const ssize_t n = ::read(c, buf, sizeof buf);
                if (n <= 0) break;
                got.append(buf, std::size_t(n));
            }
            {
                std::lock_guard<std::mutex> lock(mu_);  // recorded before the browser sees the connection close
                requests_.push_back(got.substr(0, got.find('\r')));
            }
            ::close(c);
            busy_ = false;
        }
    }
    int fd_ = -1, port_ = 0;
    std::atomic<bool> busy_{false};
    std::atomic<bool> stop_{false};
    std::thread thread_;
    std::mutex mu_;
    std::vector<std::string> requests_;
};

std::string find_chromium() {
    for (const char* name : {"chromium", "chromium-browser", "google-chrome"}) {
        const std::string probe = std::string("command -v ") + name + " >/dev/null 2>&1";
        if (std::system(probe.c_str()) == 0) return name;
    }
    return "";
}

struct BrowserRun {
    int status = -1;
    std::string out, log;  // stdout (the DOM with --dump-dom) and stderr (console messages among them)
};

// Headless Chromium on a local file, never longer than 90 s (timeout kills it). `action` is --dump-dom or
// --screenshot=PATH. Background services are off and every request goes to `proxy_port`.
BrowserRun run_chromium(const std::string& chromium, const TempDir& tmp, const std::string& page, const std::string& action,
                        int proxy_port) {
    const std::string profile = tmp / "chromium-profile", out = tmp / "chromium.out", log = tmp / "chromium.log";
    std::string cmd = "timeout -k 5 90 " + chromium +
                      " --headless --disable-gpu --no-first-run --no-default-browser-check --disable-extensions"
                      " --disable-background-networking --disable-component-update --disable-sync --disable-default-apps"
                      " --disable-dev-shm-usage --hide-scrollbars --disable-features=NetworkTimeServiceQuerying,OptimizationHints,MediaRouter,Translate,AutofillServerCommunication --disable-client-side-phishing-detection --safebrowsing-disable-auto-update --no-pings --metrics-recording-only --window-size=1400,2400 --enable-logging=stderr --v=0"
                      " --proxy-server=http://127.0.0.1:" + std::to_string(proxy_port) +
                      " --proxy-bypass-list='<-loopback>' --user-data-dir=" + shell_quote(profile) + " " + action;
    if (::geteuid() == 0) cmd += " --no-sandbox";  // Chromium refuses to run as root with its sandbox
    cmd += " " + shell_quote("file://" + fs::absolute(page).string()) + " >" + shell_quote(out) + " 2>" + shell_quote(log);
    const int raw = std::system(cmd.c_str());
    BrowserRun r;
    r.status = raw != -1 && WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
    r.out = read_all(out);
    r.log = read_all(log);
    return r;
}

// The host a proxy request line names: "CONNECT host:443 HTTP/1.1" or "GET http://host/path HTTP/1.1".
std::string request_host(const std::string& line) {
    std::string target = line.substr(line.find(' ') + 1);
    target = target.substr(0, target.find(' '));
    if (target.rfind("http://", 0) == 0) target = target.substr(7);
    else if (target.rfind("https://", 0) == 0) target = target.substr(8);
    return target.substr(0, target.find_first_of(":/"));
}

// Chromium's own services, which it calls whatever page it shows (component updates, sign-in, network
// time, safe browsing), even with --disable-background-networking. Only these exact hosts: a page's own
// loads from Google (fonts.googleapis.com, fonts.gstatic.com, www.google.com) still count.
bool browser_service(const std::string& host) {
    for (const char* h : {"update.googleapis.com", "clients2.google.com", "clients1.google.com", "accounts.google.com",
                          "clientservices.googleapis.com", "safebrowsing.googleapis.com", "redirector.gvt1.com",
                          "optimizationguide-pa.googleapis.com", "content-autofill.googleapis.com",
                          "android.clients.google.com", "edgedl.me.gvt1.com", "dl.google.com"})
        if (host == h) return true;
    const std::string gvt1 = ".gvt1.com";  // the component updater's download mirrors
    return host.size() > gvt1.size() && host.compare(host.size() - gvt1.size(), gvt1.size(), gvt1) == 0;
}

// The requests a page made: all that reached the proxy but those of Chromium's own services.
std::vector<std::string> page_requests(const std::vector<std::string>& all) {
    std::vector<std::string> page;
    for (const std::string& r : all)
        if (!browser_service(request_host(r))) page.push_back(r);
    return page;
}

std::string joined(const std::vector<std::string>& v) {
    std::string s;
    for (const auto& x : v) s += x + "\n";
    return s;
}

}  // namespace

TEST_CASE("report: the browser test attributes proxy requests to the page or to Chromium's own services", "[report]") {
    CHECK(request_host("CONNECT update.googleapis.com:443 HTTP/1.1") == "update.googleapis.com");
    CHECK(request_host("GET http://tapeformer-canary.invalid/pixel.png HTTP/1.1") == "tapeformer-canary.invalid");
    CHECK(page_requests({"CONNECT accounts.google.com:443 HTTP/1.1", "GET http://r1---sn-x.gvt1.com/edgedl/x HTTP/1.1"}).empty());
    CHECK(page_requests({"CONNECT fonts.googleapis.com:443 HTTP/1.1"}).size() == 1);  // a page's web font counts
    CHECK(page_requests({"GET http://127.0.0.1:8000/x.png HTTP/1.1"}).size() == 1);
}

TEST_CASE("report: headless Chromium renders every chart, the page makes no request, a screenshot is kept",
          "[report][browser]") {
    const std::string chromium = find_chromium();
    if (chromium.empty()) {  // none of its names on PATH: skipped (failed under scripts/test.sh, which installs it)
        tool_missing("chromium", "the report's browser test did not run (Debian: apt-get install chromium, or "
                                 "scripts/install-deps.sh)");
        return;
    }
    TempDir tmp("report_browser");
    const std::string dir = trained_run(tmp);
    REQUIRE(run_status(tmp, "report --model " + shell_quote(dir)) == 0);
    const std::string page = dir + "/report.html";
    RequestRecorder proxy;

    // The detector works: a page without a CSP that loads an image sends its request to the proxy ...
    const std::string canary = "http://tapeformer-canary.invalid/pixel.png";
    write_all(tmp / "control.html", "<!DOCTYPE html><html><body><img src=\"" + canary + "\"></body></html>\n");
    BrowserRun control = run_chromium(chromium, tmp, tmp / "control.html", "--dump-dom", proxy.port());
    {
        INFO("chromium exit " << control.status << " on the page without a CSP, log:\n" << control.log.substr(0, 3000));
        REQUIRE(control.status == 0);
    }
    INFO("requests that reached the proxy:\n" << joined(proxy.requests()));
    CHECK(joined(page_requests(proxy.requests())).find("tapeformer-canary.invalid") != std::string::npos);
    // ... and the same page under the report's CSP sends none, and Chromium logs the refusal.
    proxy.clear();
    write_all(tmp / "control_csp.html",
              "<!DOCTYPE html><html><head><meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
              "style-src 'unsafe-inline'\"></head><body><img src=\"" + canary + "\"></body></html>\n");
    control = run_chromium(chromium, tmp, tmp / "control_csp.html", "--dump-dom", proxy.port());
    {
        INFO("chromium exit " << control.status << " on the page with the CSP, log:\n" << control.log.substr(0, 3000));
        REQUIRE(control.status == 0);
        CHECK(page_requests(proxy.requests()).empty());
        CHECK(control.log.find("Content Security Policy") != std::string::npos);
    }

    // The report: the DOM Chromium built holds every section and chart; no request reached the proxy and
    // nothing was refused (a refusal would mean the page tried to load something).
    proxy.clear();
    const BrowserRun r = run_chromium(chromium, tmp, page, "--dump-dom", proxy.port());
    INFO("chromium exit " << r.status << ", log:\n" << r.log.substr(0, 3000));
    REQUIRE(r.status == 0);
    check_page(r.out);
    CHECK(count(r.out, "<svg") == count(read_all(page), "<svg"));  // the parser kept every picture
    // In the DOM Chromium built, every heatmap is a figure of its own: one picture holding its title and one
    // colour bar with values (a title outside its map's figure reads as the next map's).
    std::size_t heatmaps = 0;
    for (std::size_t at = r.out.find("<figure"); at != std::string::npos; at = r.out.find("<figure", at + 1)) {
        const std::string figure = r.out.substr(at, r.out.find("</figure>", at) - at);
        if (figure.find("colour-bar") == std::string::npos) continue;
        ++heatmaps;
        INFO(figure.substr(0, 300));
        CHECK(count(figure, "<svg") == 1);
        CHECK(count(figure, "class=\"map-title\"") == 1);
        CHECK(count(figure, "class=\"colour-bar\"") == 1);
        CHECK(count(figure, "<figcaption") == 0);
    }
    CHECK(heatmaps == count(r.out, "class=\"colour-bar\""));  // no colour bar outside a figure
    CHECK(heatmaps >= 6);  // attention maps, positional table, three masks, label smoothing
    CHECK(count(r.out, " src=") == 0);
    CHECK(page_requests(proxy.requests()).empty());
    CHECK(r.log.find("Content Security Policy") == std::string::npos);
    CHECK(r.log.find("Refused to") == std::string::npos);

    // The screenshot stays in the build tree as a test artifact.
    const std::string shot = std::string(TF_BINARY_DIR) + "/test-artifacts/report.png";
    fs::create_directories(fs::path(shot).parent_path());
    fs::remove(shot);
    const BrowserRun s = run_chromium(chromium, tmp, page, "--screenshot=" + shell_quote(shot), proxy.port());
    CHECK(s.status == 0);
    REQUIRE(fs::exists(shot));
    CHECK(read_all(shot).substr(1, 3) == "PNG");
    CHECK(fs::file_size(shot) > 20000);  // a page of charts, not a blank one
    CHECK(page_requests(proxy.requests()).empty());
}
