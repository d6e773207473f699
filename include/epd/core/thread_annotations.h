// epd/core/thread_annotations.h: clang's thread-safety attributes as macros.
//
// Under clang, `-Wthread-safety` (scripts/lint.sh) checks that a field marked
// EPD_GUARDED_BY(mu) is touched only with `mu` held, and that a function
// marked EPD_REQUIRES(mu) is called only with it held. Under other compilers
// (GCC builds production) every macro expands to nothing. epd::Mutex
// (epd/core/mutex.h) is the capability these name. CONTRIBUTING.md says how
// to annotate a new lock.
#pragma once

#if defined(__clang__)
#define EPD_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define EPD_THREAD_ANNOTATION(x)
#endif

#define EPD_CAPABILITY(name) EPD_THREAD_ANNOTATION(capability(name))
#define EPD_SCOPED_CAPABILITY EPD_THREAD_ANNOTATION(scoped_lockable)
#define EPD_GUARDED_BY(mu) EPD_THREAD_ANNOTATION(guarded_by(mu))
#define EPD_PT_GUARDED_BY(mu) EPD_THREAD_ANNOTATION(pt_guarded_by(mu))
#define EPD_REQUIRES(...) EPD_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define EPD_EXCLUDES(...) EPD_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
#define EPD_ACQUIRE(...) EPD_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define EPD_RELEASE(...) EPD_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define EPD_TRY_ACQUIRE(...) EPD_THREAD_ANNOTATION(try_acquire_capability(__VA_ARGS__))
#define EPD_ASSERT_HELD(x) EPD_THREAD_ANNOTATION(assert_capability(x))
// For a function the analysis cannot follow; say why beside it.
#define EPD_NO_THREAD_SAFETY_ANALYSIS EPD_THREAD_ANNOTATION(no_thread_safety_analysis)
