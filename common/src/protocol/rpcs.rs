//! `rpcs!`: how each service's module declares its RPCs.

/// Declares RPC marker types and the opcode-name table.
macro_rules! rpcs {
    ($($(#[$doc:meta])* $name:ident = $code:literal: $request:ty => $reply:ty;)*) => {
        $(
            $(#[$doc])*
            #[derive(Debug, Clone, Copy)]
            pub struct $name;
            impl $crate::rpc::message::Rpc for $name {
                const OPCODE: $crate::rpc::frame::Opcode = $crate::rpc::frame::Opcode($code);
                const NAME: &'static str = stringify!($name);
                type Request = $request;
                type Reply = $reply;
            }
        )*
        /// Names of this service's opcodes, for logs and errors.
        pub(crate) const OPCODE_NAMES: &[(u16, &str)] = &[$(($code, stringify!($name))),*];
    };
}
pub(crate) use rpcs;
