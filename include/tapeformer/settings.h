// A setting of a configuration struct, described once: its flag and file name, its key in stored files,
// its help text, its type and bounds, and how to read and write it. A table of these drives the CLI's
// flags, config.toml, run.json and the weights file's metadata: a setting's flag, keys, help, bounds,
// reading and writing are written once, in that table (report.cpp too reads run.json through it). Not every
// mention is: the presets (train_settings.cpp) name flags, the report names the keys it shows, and bench.cpp
// and the head studies write their own "d_model": renaming a key means finding those too.
//
//   Setting<ModelConfig>  model_settings()          (model_settings.h: the weights file's metadata)
//   Setting<TrainConfig>  train_settings()          (train_settings.h: flags, config.toml, run.json)
#pragma once
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "tapeformer/config.h"
#include "tapeformer/number_text.h"

TF_NAMESPACE_BEGIN

enum class SettingType { Integer, Real, Bool, Text, Choice };

template <class Config>
struct Setting {
    std::string name;   // "d-model": the flag (--d-model) and the key in config.toml ("" = neither)
    std::string key;    // "d_model": the key in stored files (run.json, the weights file's metadata)
    std::string group;  // the heading it is listed under in --help
    std::string help;
    SettingType type = SettingType::Text;
    std::vector<std::string> choices;  // SettingType::Choice: the accepted values
    double lo = 0, hi = 0;             // Integer and Real: the accepted range [lo, hi] (hi_open: [lo, hi))
    bool lo_open = false, hi_open = false;
    bool required = true;  // must be in a stored file; false for settings newer files added (old: `absent`)
    std::string absent;    // not required: the value a file written before the setting ran with ("" = the default)
    std::string negation;  // Bool: the flag that sets it false ("separate-vocab"), "" = --no-NAME

    std::function<std::string(const Config&)> get;         // the value as canonical text
    std::function<void(Config&, const std::string&)> set;  // parses and checks; std::invalid_argument

    // "an integer in [1, 65536]", "one of post, pre": what `set` accepts, for errors and --help.
    std::string expected() const;
};

// Applies `value` to `config`; a bad value throws std::invalid_argument starting with `where`
// ("--d-model", "config.toml:3: d-model", "model metadata: d_model"), then what was expected and got.
template <class Config>
void apply_setting(const Setting<Config>& s, Config& config, const std::string& value, const std::string& where) {
    try {
        s.set(config, value);
    } catch (const std::invalid_argument& e) {
        throw std::invalid_argument(where + ": " + e.what());
    }
}

// What is wrong with the value `config` holds for `s` ("must be an integer in [1, 64], got 0"), or "" when
// nothing: for structs filled in code rather than through `set`.
template <class Config>
std::string setting_problem(const Setting<Config>& s, const Config& config);

// The setting named `name` (flag name, or the stored key when `by_key`), or nullptr.
template <class Config>
const Setting<Config>* find_setting(const std::vector<Setting<Config>>& table, const std::string& name, bool by_key = false) {
    for (const Setting<Config>& s : table)
        if ((by_key ? s.key : s.name) == name && !name.empty()) return &s;
    return nullptr;
}

// ---- building tables ------------------------------------------------------------------------------------
// Each maker takes `access`, a generic lambda returning a reference to the field in a (const or not)
// config: [](auto& c) -> auto& { return c.model.d_model; }.

namespace setting_detail {

// The shortest text that reads back as exactly `v` ("0.0005", not "0.00050000000000000001").
inline std::string format_real(double v) {
    char buf[64];
    for (int digits = 1; digits <= 17; ++digits) {
        std::snprintf(buf, sizeof buf, "%.*g", digits, v);
        if (std::strtod(buf, nullptr) == v) break;
    }
    return buf;
}

inline std::string format_bound(double v) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.10g", v);
    return buf;
}

template <class Config>
std::string range_text(const Setting<Config>& s) {
    return std::string(s.lo_open ? "(" : "[") + format_bound(s.lo) + ", " + format_bound(s.hi) + (s.hi_open ? ")" : "]");
}

template <class Config>
bool in_range(const Setting<Config>& s, double v) {
    return (s.lo_open ? v > s.lo : v >= s.lo) && (s.hi_open ? v < s.hi : v <= s.hi);
}

// Whole text as a signed integer in [lo, hi]; values outside any integer type are out of range too.
template <class Config>
long long parse_integer(const Setting<Config>& s, const std::string& text) {
    long long v = 0;
    const NumberRead read = read_integer(text, v);
    if (read == NumberRead::not_a_number) throw std::invalid_argument("must be " + s.expected() + ", got '" + text + "'");
    if (read == NumberRead::out_of_range || !in_range(s, static_cast<double>(v)))
        throw std::invalid_argument("must be " + s.expected() + ", got " + text);
    return v;
}

// Whole text as a finite real number in the setting's bounds.
template <class Config>
double parse_real(const Setting<Config>& s, const std::string& text) {
    double v = 0;
    const NumberRead read = read_real(text, v);
    if (read == NumberRead::not_a_number) throw std::invalid_argument("must be " + s.expected() + ", got '" + text + "'");
    if (read == NumberRead::out_of_range || !in_range(s, v)) throw std::invalid_argument("must be " + s.expected() + ", got " + text);
    return v;
}

template <class Config>
Setting<Config> base(std::string name, std::string key, std::string group, std::string help, SettingType type) {
    Setting<Config> s;
    s.name = std::move(name);
    s.key = std::move(key);
    s.group = std::move(group);
    s.help = std::move(help);
    s.type = type;
    return s;
}

inline bool parse_bool(const std::string& text) {
    for (const char* t : {"true", "1", "yes", "on"})
        if (text == t) return true;
    for (const char* f : {"false", "0", "no", "off"})
        if (text == f) return false;
    throw std::invalid_argument("must be true or false, got '" + text + "'");
}

}  // namespace setting_detail

template <class Config>
std::string Setting<Config>::expected() const {
    switch (type) {
        case SettingType::Integer: return "an integer in " + setting_detail::range_text(*this);
        case SettingType::Real: return "a finite number in " + setting_detail::range_text(*this);
        case SettingType::Bool: return "true or false";
        case SettingType::Text: return "text";
        case SettingType::Choice: {
            std::string all;
            for (const std::string& c : choices) all += (all.empty() ? "" : ", ") + c;
            return "one of " + all;
        }
    }
    return "";
}

template <class Config>
std::string setting_problem(const Setting<Config>& s, const Config& config) {
    const std::string value = s.get(config);
    bool ok = true;
    if (s.type == SettingType::Integer || s.type == SettingType::Real) ok = setting_detail::in_range(s, std::strtod(value.c_str(), nullptr));
    if (s.type == SettingType::Choice) ok = std::find(s.choices.begin(), s.choices.end(), value) != s.choices.end();
    return ok ? "" : "must be " + s.expected() + ", got " + value;
}

// An integer field (any integer type) accepting [lo, hi].
template <class Config, class Access>
Setting<Config> integer_setting(std::string name, std::string key, std::string group, std::string help, double lo,
                                double hi, Access access) {
    Setting<Config> s = setting_detail::base<Config>(std::move(name), std::move(key), std::move(group), std::move(help), SettingType::Integer);
    s.lo = lo;
    s.hi = hi;
    s.get = [access](const Config& c) { return std::to_string(access(c)); };
    s.set = [access, self = s](Config& c, const std::string& text) {
        using Field = std::remove_reference_t<decltype(access(c))>;
        access(c) = static_cast<Field>(setting_detail::parse_integer(self, text));
    };
    return s;
}

// A floating-point field accepting finite values in [lo, hi], or (lo, hi] / [lo, hi) when open.
template <class Config, class Access>
Setting<Config> real_setting(std::string name, std::string key, std::string group, std::string help, double lo,
                             double hi, Access access, bool lo_open = false, bool hi_open = false) {
    Setting<Config> s = setting_detail::base<Config>(std::move(name), std::move(key), std::move(group), std::move(help), SettingType::Real);
    s.lo = lo;
    s.hi = hi;
    s.lo_open = lo_open;
    s.hi_open = hi_open;
    s.get = [access](const Config& c) { return setting_detail::format_real(access(c)); };
    s.set = [access, self = s](Config& c, const std::string& text) { access(c) = setting_detail::parse_real(self, text); };
    return s;
}

template <class Config, class Access>
Setting<Config> bool_setting(std::string name, std::string key, std::string group, std::string help, std::string negation,
                             Access access) {
    Setting<Config> s = setting_detail::base<Config>(std::move(name), std::move(key), std::move(group), std::move(help), SettingType::Bool);
    s.negation = std::move(negation);
    s.get = [access](const Config& c) { return std::string(access(c) ? "true" : "false"); };
    s.set = [access](Config& c, const std::string& text) { access(c) = setting_detail::parse_bool(text); };
    return s;
}

template <class Config, class Access>
Setting<Config> text_setting(std::string name, std::string key, std::string group, std::string help, Access access) {
    Setting<Config> s = setting_detail::base<Config>(std::move(name), std::move(key), std::move(group), std::move(help), SettingType::Text);
    s.get = [access](const Config& c) { return std::string(access(c)); };
    s.set = [access](Config& c, const std::string& text) { access(c) = text; };
    return s;
}

// A field holding one of `choices`: an enum with its parse and to_string functions, or a std::string
// (then parse and show are the identity).
template <class Config, class Access, class Parse, class Show>
Setting<Config> choice_setting(std::string name, std::string key, std::string group, std::string help,
                               std::vector<std::string> choices, Access access, Parse parse, Show show) {
    Setting<Config> s = setting_detail::base<Config>(std::move(name), std::move(key), std::move(group), std::move(help), SettingType::Choice);
    s.choices = std::move(choices);
    s.get = [access, show](const Config& c) { return std::string(show(access(c))); };
    s.set = [access, parse, self = s](Config& c, const std::string& text) {
        for (const std::string& choice : self.choices)
            if (choice == text) {
                access(c) = parse(text);
                return;
            }
        throw std::invalid_argument("must be " + self.expected() + ", got '" + text + "'");
    };
    return s;
}

// A setting newer versions added: files written before it may lack it, and then get `absent` — the value
// they ran with, where the default has changed since — or else its default.
template <class Config>
Setting<Config> added_later(Setting<Config> s, std::string absent = "") {
    s.required = false;
    s.absent = std::move(absent);
    return s;
}

// A setting of an inner struct as a setting of the outer one: lift(s, [](auto& t) -> auto& { return t.model; }).
template <class Outer, class Inner, class Project>
Setting<Outer> lift_setting(const Setting<Inner>& s, Project project) {
    Setting<Outer> out = setting_detail::base<Outer>(s.name, s.key, s.group, s.help, s.type);
    out.choices = s.choices;
    out.lo = s.lo;
    out.hi = s.hi;
    out.lo_open = s.lo_open;
    out.hi_open = s.hi_open;
    out.required = s.required;
    out.absent = s.absent;
    out.negation = s.negation;
    out.get = [get = s.get, project](const Outer& o) { return get(project(o)); };
    out.set = [set = s.set, project](Outer& o, const std::string& text) { set(project(o), text); };
    return out;
}

TF_NAMESPACE_END
