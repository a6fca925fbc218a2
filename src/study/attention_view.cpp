// attention_view(): bertviz's head view as one offline page. The C++ side only embeds the maps as JSON;
// the inline script draws the two token columns and the lines, and redraws them on every selection.
#include <nlohmann/json.hpp>
#include <sstream>

#include "tapeformer/study/attention_maps.h"
#include "tapeformer/teach/svg.h"

TF_NAMESPACE_BEGIN

namespace {

// JSON that may sit inside <script>: "<", ">" and "&" only occur inside strings, where \u escapes mean the same.
std::string script_safe(const std::string& json) {
    std::string out;
    for (char ch : json) {
        if (ch == '<') out += "\\u003c";
        else if (ch == '>') out += "\\u003e";
        else if (ch == '&') out += "\\u0026";
        else out += ch;
    }
    return out;
}

const char* kView_script = R"JS(
const data = JSON.parse(document.getElementById('maps').textContent);
const kinds = [['encoder_self', 'encoder self-attention', 'src', 'src', 'E'],
               ['decoder_self', 'decoder self-attention (causal)', 'tgt_in', 'tgt_in', 'D'],
               ['cross', 'cross-attention', 'tgt_in', 'src', 'A']].filter(k => data[k[0]].length > 0);
const colours = ['#1f77b4', '#ff7f0e', '#2ca02c', '#d62728', '#9467bd', '#8c564b', '#e377c2', '#17becf'];
const $ = id => document.getElementById(id);
// The query token whose lines are shown alone: the one clicked (pinned until clicked again), else the one
// under the pointer, else none (every line).
let pinned = null, hovered = null;
const shown = () => pinned !== null ? pinned : hovered;
function option(select, value, text) { const o = document.createElement('option'); o.value = value; o.textContent = text; select.appendChild(o); }
for (const k of kinds) option($('kind'), k[0], k[1]);
function fill_layers_heads() {
  const k = kinds.find(k => k[0] === $('kind').value), maps = data[k[0]];
  const layer = $('layer').value, head = $('head').value;
  $('layer').textContent = ''; $('head').textContent = '';
  maps.forEach((_, l) => option($('layer'), l, 'layer ' + l));
  option($('head'), 'all', 'all heads');
  maps[0].forEach((_, h) => option($('head'), h, 'head ' + h + (masked(k, layer === '' ? 0 : +layer, h) ? ' (masked)' : '')));
  if (layer !== '' && layer < maps.length) $('layer').value = layer;
  if (head !== '' && (head === 'all' || head < maps[0].length)) $('head').value = head;
}
function masked(k, l, h) { return data.masked.includes(k[4] + ':' + l + ':' + h); }
function draw() {
  const k = kinds.find(k => k[0] === $('kind').value), l = +$('layer').value;
  const heads = $('head').value === 'all' ? data[k[0]][l].map((_, h) => h) : [+$('head').value];
  const queries = data.tokens[k[2]], keys = data.tokens[k[3]];
  const svg = $('view'), ns = 'http://www.w3.org/2000/svg', row = 22, x0 = 150, x1 = 400;
  svg.textContent = '';
  svg.setAttribute('height', row * Math.max(queries.length, keys.length) + 40);
  const el = (name, attrs, text) => { const e = document.createElementNS(ns, name); for (const a in attrs) e.setAttribute(a, attrs[a]); if (text !== undefined) e.textContent = text; svg.appendChild(e); return e; };
  for (const h of heads) {
    const w = data[k[0]][l][h], grey = masked(k, l, h);
    w.forEach((r, q) => r.forEach((v, key) => {
      if (v <= 0 || (shown() !== null && shown() !== q)) return;
      el('line', {class: 'att' + (grey ? ' masked' : ''), x1: x0, y1: 20 + q * row, x2: x1, y2: 20 + key * row,
                  stroke: grey ? '#999' : colours[h % colours.length], 'stroke-opacity': v, 'stroke-width': 1 + 4 * v,
                  'data-head': h, 'data-query': q, 'data-key': key, 'data-weight': v});
    }));
  }
  queries.forEach((t, q) => {
    const e = el('text', {class: 'tok query' + (shown() === q ? ' selected' : '') + (pinned === q ? ' pinned' : ''), x: x0 - 8, y: 24 + q * row, 'text-anchor': 'end', 'data-index': q}, t);
    e.addEventListener('mouseenter', () => { if (hovered !== q) { hovered = q; draw(); } });
    e.addEventListener('click', () => { pinned = pinned === q ? null : q; draw(); });
  });
  keys.forEach((t, key) => {
    el('text', {class: 'tok key', x: x1 + 8, y: 24 + key * row, 'data-index': key}, t);
    if (shown() !== null && heads.length === 1)
      el('text', {class: 'weight', x: x1 + 120, y: 24 + key * row, 'data-key': key}, data[k[0]][l][heads[0]][shown()][key].toFixed(3));
  });
  const names = heads.filter(h => masked(k, l, h)).map(h => k[4] + ':' + l + ':' + h);
  $('masked').textContent = names.length ? 'masked (drawn grey; their output is switched off): ' + names.join(', ') : '';
  $('legend').textContent = '';
  for (const h of heads) { const s = document.createElement('span'); s.className = 'legend'; s.style.color = masked(k, l, h) ? '#999' : colours[h % colours.length]; s.textContent = 'head ' + h + (masked(k, l, h) ? ' (masked)' : '') + ' '; $('legend').appendChild(s); }
}
$('kind').addEventListener('change', () => { pinned = hovered = null; fill_layers_heads(); draw(); });
$('layer').addEventListener('change', () => { fill_layers_heads(); draw(); });  // the masked labels are per layer
$('head').addEventListener('change', draw);
$('view').addEventListener('mouseleave', () => { hovered = null; draw(); });
fill_layers_heads(); draw();
)JS";

}  // namespace

std::string attention_view(const AttentionMaps& m, const std::string& title) {
    const nlohmann::json j = {{"tokens", {{"src", m.src}, {"tgt_in", m.tgt_in}, {"tgt_out", m.tgt_out}}},
                              {"target_decoded", m.decoded},
                              {"masked", m.masked},
                              {"encoder_self", m.encoder_self},
                              {"decoder_self", m.decoder_self},
                              {"cross", m.cross}};
    std::ostringstream o;
    o << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
      << "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; script-src 'unsafe-inline'; "
         "style-src 'unsafe-inline'; img-src data:\">\n"
      << "<title>" << xml_escape(title) << "</title>\n"
      << "<style>body{font-family:sans-serif;margin:1em 2em}select{margin-right:1em}.tok{font-size:14px;cursor:pointer}"
         ".tok.selected{font-weight:bold}.tok.pinned{text-decoration:underline}.weight{font-size:12px;fill:#444}#masked{color:#999}.legend{font-size:13px}</style>\n"
      << "</head><body>\n<h1>" << xml_escape(title) << "</h1>\n"
      << "<p>Queries on the left, keys on the right; a line's opacity and width follow the weight (0 draws no line: the "
         "decoder's future). Hover over a query token for its lines alone and the weights; click it to keep them (click again to "
         "let go).</p>\n"
      << "<p><select id=\"kind\"></select><select id=\"layer\"></select><select id=\"head\"></select><span id=\"legend\"></span></p>\n"
      << "<p id=\"masked\"></p>\n<svg id=\"view\" xmlns=\"http://www.w3.org/2000/svg\" width=\"600\"></svg>\n"
      << "<script type=\"application/json\" id=\"maps\">" << script_safe(j.dump()) << "</script>\n"
      << "<script>" << kView_script << "</script>\n</body></html>\n";
    return o.str();
}

TF_NAMESPACE_END
