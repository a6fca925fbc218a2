// Learning-rate schedules against values worked out by hand from their formulas, plus the edges
// (warmup 0, steps past the end) and the errors a user can trigger from the command line.
#include <catch2/catch.hpp>

#include <cmath>
#include <stdexcept>
#include <string>

#include "tapeformer/schedule.h"

using Catch::Matchers::Contains;

namespace {

tf::Schedule make(tf::ScheduleKind kind, double lr, std::int64_t warmup, std::int64_t total = 0, double min_lr = 0) {
    tf::Schedule s;
    s.kind = kind;
    s.lr = lr;
    s.warmup = warmup;
    s.total_steps = total;
    s.min_lr = min_lr;
    return s;
}

}  // namespace

TEST_CASE("noam: the paper's schedule at d_model 512, warmup 4000", "[schedule]") {
    tf::Schedule s;  // defaults are the paper's: noam, factor 1, d_model 512, warmup 4000
    REQUIRE(s.kind == tf::ScheduleKind::Noam);
    // s = 1:     512^-0.5 · 1 · 4000^-1.5 = 1 / (22.627417 · 252982.21) = 1.7469281e-7
    CHECK(s.lr_at(1) == Approx(1.746928107421711e-07).epsilon(1e-12));
    // s = 2000:  512^-0.5 · 2000 · 4000^-1.5 = half the peak = 3.4938562e-4
    CHECK(s.lr_at(2000) == Approx(3.493856214843422e-04).epsilon(1e-12));
    // s = 4000:  the peak, 512^-0.5 · 4000^-0.5 = 1 / √2048000 = 6.9877124e-4 (both branches of min agree)
    CHECK(s.lr_at(4000) == Approx(6.9877124296868428e-04).epsilon(1e-12));
    // s = 16000: 512^-0.5 · 16000^-0.5 = peak / 2 = 3.4938562e-4
    CHECK(s.lr_at(16000) == Approx(3.4938562148434214e-04).epsilon(1e-12));
    // Rising before the peak, falling after it.
    CHECK(s.lr_at(3999) < s.lr_at(4000));
    CHECK(s.lr_at(4001) < s.lr_at(4000));

    // factor 2, d_model 256, no warmup: 2 · 256^-0.5 · 100^-0.5 = 2 / (16 · 10) = 0.0125
    tf::Schedule t = make(tf::ScheduleKind::Noam, 2.0, 0);
    t.d_model = 256;
    CHECK(t.lr_at(100) == Approx(0.0125).epsilon(1e-12));
    CHECK(t.lr_at(1) == Approx(0.125).epsilon(1e-12));  // 2 / 16
}

TEST_CASE("inverse_sqrt: linear warmup to lr at step w, then lr·sqrt(w/s)", "[schedule]") {
    tf::Schedule s = make(tf::ScheduleKind::InverseSqrt, 5e-4, 4000);
    CHECK(s.lr_at(1) == Approx(1.25e-7).epsilon(1e-12));     // 5e-4 · 1/4000
    CHECK(s.lr_at(2000) == Approx(2.5e-4).epsilon(1e-12));   // 5e-4 · 2000/4000
    CHECK(s.lr_at(4000) == Approx(5e-4).epsilon(1e-12));     // the peak
    CHECK(s.lr_at(16000) == Approx(2.5e-4).epsilon(1e-12));  // 5e-4 · √(4000/16000) = 5e-4 / 2
    CHECK(s.lr_at(36000) == Approx(5e-4 / 3).epsilon(1e-12));  // √(4000/36000) = 1/3

    // The same curve as Noam with its peak given directly.
    tf::Schedule noam;
    const double peak = noam.lr_at(4000);
    tf::Schedule same = make(tf::ScheduleKind::InverseSqrt, peak, 4000);
    for (std::int64_t step : {1, 100, 3999, 4000, 4001, 50000}) CHECK(same.lr_at(step) == Approx(noam.lr_at(step)).epsilon(1e-12));

    // warmup 0 behaves as warmup 1: lr / √s.
    tf::Schedule none = make(tf::ScheduleKind::InverseSqrt, 0.1, 0);
    CHECK(none.lr_at(1) == Approx(0.1).epsilon(1e-12));
    CHECK(none.lr_at(4) == Approx(0.05).epsilon(1e-12));
}

TEST_CASE("cosine: warmup, half a cosine down to min_lr at total_steps, then min_lr", "[schedule]") {
    // lr 1e-3, warmup 100, total 1100 (decay phase of 1000 steps), floor 1e-5.
    tf::Schedule s = make(tf::ScheduleKind::Cosine, 1e-3, 100, 1100, 1e-5);
    CHECK(s.lr_at(1) == Approx(1e-5).epsilon(1e-12));    // 1e-3 · 1/100
    CHECK(s.lr_at(50) == Approx(5e-4).epsilon(1e-12));   // 1e-3 · 50/100
    CHECK(s.lr_at(100) == Approx(1e-3).epsilon(1e-12));  // the peak
    // s = 350, a quarter through: 1e-5 + 9.9e-4 · ½(1 + cos(π/4)) = 1e-5 + 9.9e-4 · 0.85355339 = 8.5501786e-4
    CHECK(s.lr_at(350) == Approx(8.5501785668734098e-04).epsilon(1e-12));
    // s = 600, half way: 1e-5 + 9.9e-4 · ½ = 5.05e-4
    CHECK(s.lr_at(600) == Approx(5.05e-4).epsilon(1e-12));
    // s = 850: 1e-5 + 9.9e-4 · ½(1 + cos(3π/4)) = 1e-5 + 9.9e-4 · 0.14644661 = 1.5498214e-4
    CHECK(s.lr_at(850) == Approx(1.5498214331265901e-04).epsilon(1e-12));
    CHECK(s.lr_at(1100) == Approx(1e-5).epsilon(1e-12));  // the floor at total_steps
    CHECK(s.lr_at(5000) == Approx(1e-5).epsilon(1e-12));  // and after it

    // No warmup: step 1 is already one step into the decay.
    tf::Schedule cold = make(tf::ScheduleKind::Cosine, 1.0, 0, 2);
    CHECK(cold.lr_at(1) == Approx(0.5).epsilon(1e-12));   // ½(1 + cos(π/2))
    CHECK(cold.lr_at(2) == Approx(0.0).margin(1e-15));    // ½(1 + cos(π))
}

TEST_CASE("linear: warmup, then a straight line down to min_lr at total_steps", "[schedule]") {
    tf::Schedule s = make(tf::ScheduleKind::Linear, 1e-3, 100, 1100);
    CHECK(s.lr_at(10) == Approx(1e-4).epsilon(1e-12));    // 1e-3 · 10/100
    CHECK(s.lr_at(100) == Approx(1e-3).epsilon(1e-12));
    CHECK(s.lr_at(350) == Approx(7.5e-4).epsilon(1e-12));  // 1e-3 − 1e-3 · 250/1000
    CHECK(s.lr_at(600) == Approx(5e-4).epsilon(1e-12));    // 1e-3 − 1e-3 · 500/1000
    CHECK(s.lr_at(1100) == Approx(0.0).margin(1e-15));
    CHECK(s.lr_at(2000) == Approx(0.0).margin(1e-15));

    s.min_lr = 1e-4;  // 1e-3 − 9e-4 · 500/1000 = 5.5e-4
    CHECK(s.lr_at(600) == Approx(5.5e-4).epsilon(1e-12));
    CHECK(s.lr_at(1100) == Approx(1e-4).epsilon(1e-12));
    CHECK(s.lr_at(3000) == Approx(1e-4).epsilon(1e-12));
}

TEST_CASE("constant: lr, after an optional linear warmup", "[schedule]") {
    tf::Schedule s = make(tf::ScheduleKind::Constant, 0.1, 10);
    CHECK(s.lr_at(5) == Approx(0.05).epsilon(1e-12));  // 0.1 · 5/10
    CHECK(s.lr_at(10) == Approx(0.1).epsilon(1e-12));
    CHECK(s.lr_at(1000000) == Approx(0.1).epsilon(1e-12));
    tf::Schedule flat = make(tf::ScheduleKind::Constant, 0.1, 0);
    CHECK(flat.lr_at(1) == Approx(0.1).epsilon(1e-12));
    CHECK(flat.lr_at(777) == Approx(0.1).epsilon(1e-12));
}

TEST_CASE("schedule kind names parse and print, and unknown names list the valid ones", "[schedule]") {
    for (tf::ScheduleKind k : {tf::ScheduleKind::Noam, tf::ScheduleKind::InverseSqrt, tf::ScheduleKind::Cosine,
                               tf::ScheduleKind::Linear, tf::ScheduleKind::Constant})
        CHECK(tf::parse_schedule_kind(tf::schedule_kind_name(k)) == k);
    CHECK(std::string(tf::schedule_kind_name(tf::ScheduleKind::InverseSqrt)) == "inverse_sqrt");
    CHECK(tf::parse_schedule_kind("cosine") == tf::ScheduleKind::Cosine);

    CHECK_THROWS_AS(tf::parse_schedule_kind("Noam"), std::invalid_argument);  // names are lower case
    CHECK_THROWS_WITH(tf::parse_schedule_kind("exponential"),
                      Contains("'exponential'") && Contains("noam, inverse_sqrt, cosine, linear, constant"));

    CHECK(make(tf::ScheduleKind::Cosine, 5e-4, 1000, 20000, 1e-5).describe() ==
          "cosine(lr=0.0005, warmup=1000, total_steps=20000, min_lr=1e-05)");
    CHECK(tf::Schedule().describe() == "noam(factor=1, warmup=4000, d_model=512)");
}

TEST_CASE("invalid schedules and steps are rejected with a message naming the field", "[schedule]") {
    tf::Schedule ok = make(tf::ScheduleKind::Constant, 0.1, 0);
    CHECK_THROWS_WITH(ok.lr_at(0), Contains("steps count from 1"));
    CHECK_THROWS_AS(ok.lr_at(-3), std::invalid_argument);

    CHECK_THROWS_WITH(make(tf::ScheduleKind::InverseSqrt, 0.1, -1).lr_at(1), Contains("warmup must be >= 0"));
    CHECK_THROWS_WITH(make(tf::ScheduleKind::Constant, 0.0, 0).lr_at(1), Contains("lr must be"));
    CHECK_THROWS_WITH(make(tf::ScheduleKind::Constant, NAN, 0).validate(), Contains("lr must be"));
    // Decays need total_steps > warmup.
    CHECK_THROWS_WITH(make(tf::ScheduleKind::Cosine, 0.1, 100, 100).lr_at(1),
                      Contains("cosine") && Contains("total_steps (100) must be greater than warmup (100)"));
    CHECK_THROWS_WITH(make(tf::ScheduleKind::Linear, 0.1, 0, 0).validate(), Contains("total_steps (0)"));
    CHECK_THROWS_WITH(make(tf::ScheduleKind::Cosine, 0.1, 10, 100, 0.2).validate(), Contains("min_lr"));
    CHECK_THROWS_WITH(make(tf::ScheduleKind::Linear, 0.1, 10, 100, -1e-3).validate(), Contains("min_lr"));
    tf::Schedule noam;
    noam.d_model = 0;
    CHECK_THROWS_WITH(noam.validate(), Contains("d_model"));
    // total_steps does not matter to the schedules that never end.
    CHECK_NOTHROW(make(tf::ScheduleKind::InverseSqrt, 0.1, 100, 0).validate());
    CHECK_NOTHROW(make(tf::ScheduleKind::Constant, 0.1, 100, 5).validate());
}

TEST_CASE("cooldown_factor: 1 until the run's last fraction, then a straight line down to 0 at its end", "[schedule]") {
    // fraction 0.25: the factor leaves 1 when three quarters of the run are done
    CHECK(tf::cooldown_factor(0.0, 0.25) == 1);
    CHECK(tf::cooldown_factor(0.75, 0.25) == 1);
    CHECK(tf::cooldown_factor(0.8, 0.25) == Approx(0.8).epsilon(1e-12));    // (1 − 0.8) / 0.25
    CHECK(tf::cooldown_factor(0.9375, 0.25) == Approx(0.25).epsilon(1e-12));
    CHECK(tf::cooldown_factor(1.0, 0.25) == 0);
    CHECK(tf::cooldown_factor(1.5, 0.25) == 0);  // past the end (a run continued beyond its stop): never negative
    // fraction 0 is no cooldown, even at the run's end
    CHECK(tf::cooldown_factor(0.999, 0) == 1);
    CHECK(tf::cooldown_factor(1.0, 0) == 1);
    CHECK_THROWS_WITH(tf::cooldown_factor(0.5, 1.0), Contains("cooldown must be in [0, 1)"));
    CHECK_THROWS_WITH(tf::cooldown_factor(0.5, -0.1), Contains("cooldown"));
    CHECK_THROWS_AS(tf::cooldown_factor(0.5, NAN), std::invalid_argument);
}
