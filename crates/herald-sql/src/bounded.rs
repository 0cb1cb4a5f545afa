//! Every call to a PostgreSQL store within the client-side bound ([`crate::custody::Bound`]).
//!
//! The store traits are declared through [`bounded_trait!`](crate::bounded_trait), which writes, from
//! the one list of methods, both the trait and its bounded decorator: each `async` method of the
//! decorator runs the inner store's within the bound. A method added to the trait is bounded without
//! anyone having to remember it, and the decorator cannot drift from the trait. The sender's store
//! (`herald_store::bounded::BoundedStore`) and the inbox's are declared through it.
//!
//! The bound is per call, not per statement: every call is short by design (listings are paged,
//! maintenance works in chunks), and a call that outlasts `statement_timeout + acquire timeout` is
//! answered 503 like one whose server went silent.

/// Declare a store trait (`async` methods, each returning a `Result` whose error converts from
/// [`crate::custody::TimedOut`]) and implement it for a decorator type with fields `inner` (the store it
/// wraps, reachable as the trait) and `bound` (a [`crate::custody::Bound`]): each `async` method runs the
/// inner one within the bound. Methods that are not to be bounded (synchronous ones, defaults) go in the
/// `unbounded` block, and their forwarding in the `forwarded` block.
#[macro_export]
macro_rules! bounded_trait {
    (
        $(#[$meta:meta])*
        $vis:vis trait $name:ident: [$($supertraits:tt)*], bounded in $wrapper:ty {
            $(
                $(#[$method_meta:meta])*
                async fn $method:ident(&self $(, $arg:ident: $arg_type:ty)* $(,)?) -> $result:ty;
            )*
        }
        unbounded { $($unbounded:tt)* }
        forwarded { $($forwarded:tt)* }
    ) => {
        $(#[$meta])*
        #[async_trait::async_trait]
        $vis trait $name: $($supertraits)* {
            $(
                $(#[$method_meta])*
                async fn $method(&self $(, $arg: $arg_type)*) -> $result;
            )*
            $($unbounded)*
        }

        #[async_trait::async_trait]
        impl $name for $wrapper {
            $(
                async fn $method(&self $(, $arg: $arg_type)*) -> $result {
                    self.bound.run(self.inner.$method($($arg),*)).await
                }
            )*
            $($forwarded)*
        }
    };
}
